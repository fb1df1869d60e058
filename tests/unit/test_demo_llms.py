"""The demo LLM behind each Triton LLM interface: `--demo-llm`, the configuration and the Triton models
it selects, and the pure parts of the shared core (TensorRT-LLM word lists, incremental detokenization).
The models themselves run only inside Triton."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from launcher.cli import build_parser
from launcher.stack import (
    ALL_DEMO_LLMS_CONFIG,
    DEFAULT_CONFIG,
    DEFAULT_DEMO_LLMS,
    DEMO_LLM_REPOSITORY,
    DEMO_LLMS,
    demo_llm_config,
    demo_llm_triton,
    parse_demo_llms,
)
from tritongate.config import load_model_config
from tritongate.demo_models.llm_core import RequestError
from tritongate.demo_models.llm_text import IncrementalDecoder
from tritongate.demo_models.llm_trtllm import Inputs, parse_items, word_list
from tritongate.settings import DEPLOY_DIR, Settings


def test_demo_llm_names_lists_and_all() -> None:
    assert parse_demo_llms(["all"]) == tuple(DEMO_LLMS)
    assert parse_demo_llms(["vllm, fastertransformer", "vllm"]) == ("fastertransformer", "vllm")
    with pytest.raises(ValueError, match="unknown demo LLM 'trt'"):
        parse_demo_llms(["trt"])
    args = build_parser().parse_args(["up", "--demo-llm", "tensorrt_llm", "--demo-llm", "vllm"])
    assert args.demo_llm == [("tensorrt_llm",), ("vllm",)]
    assert build_parser().parse_args(["triton", "--demo-llm", "all"]).demo_llm == [tuple(DEMO_LLMS)]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--demo-llm", "nope"])


def test_the_default_stack_adds_the_tensorrt_llm_demo_llm_to_the_demo_repository(tmp_path: Path) -> None:
    """TensorRT-LLM's interface has guided decoding: the default stack can show tools and structured output."""
    settings = Settings()
    repositories, models = demo_llm_triton(settings, DEFAULT_DEMO_LLMS)
    default = sorted(p.name for p in (DEPLOY_DIR / "triton").iterdir() if (p / "config.pbtxt").is_file())
    assert repositories == [DEMO_LLM_REPOSITORY] and models == [*default, DEMO_LLMS["tensorrt_llm"]]
    assert demo_llm_config(settings, DEFAULT_DEMO_LLMS) == DEFAULT_CONFIG
    assert [entry.name for entry in load_model_config(DEFAULT_CONFIG).llm] == [DEMO_LLMS[name] for name in
                                                                               DEFAULT_DEMO_LLMS]
    # A configuration or a repository of your own: its repositories whole, nothing added.
    assert demo_llm_triton(Settings(config_file=tmp_path / "mine.json"), DEFAULT_DEMO_LLMS) == ([], None)
    assert demo_llm_triton(Settings(triton_model_repository=[tmp_path]), DEFAULT_DEMO_LLMS) == ([], None)


def test_all_adds_the_repository_and_loads_every_model(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path)
    repositories, models = demo_llm_triton(settings, tuple(DEMO_LLMS))
    assert repositories == [DEMO_LLM_REPOSITORY]
    default = sorted(p.name for p in (DEPLOY_DIR / "triton").iterdir() if (p / "config.pbtxt").is_file())
    assert models == [*default, *(m for m in DEMO_LLMS.values() if m not in default)]
    assert demo_llm_config(settings, tuple(DEMO_LLMS)) == ALL_DEMO_LLMS_CONFIG


def test_a_subset_loads_and_configures_only_those_llms(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path)
    _, models = demo_llm_triton(settings, ("vllm",))
    assert models is not None and DEMO_LLMS["vllm"] in models
    assert not {DEMO_LLMS[name] for name in ("fastertransformer", "tensorrt_llm", "tensorrt_llm_text")} & set(models)
    config = json.loads(demo_llm_config(settings, ("vllm",)).read_text())
    assert [entry["name"] for entry in config["llm"]] == [DEMO_LLMS["vllm"]]
    assert [info["name"] for info in config["model_infos"]] == [DEMO_LLMS["vllm"]]
    assert config["embedding"] and config["rerank"]
    own = tmp_path / "mine.json"
    assert demo_llm_config(Settings(config_file=own), ("vllm",)) == own  # a given configuration wins


@pytest.mark.parametrize("demo_llms", [DEFAULT_DEMO_LLMS, tuple(DEMO_LLMS), ("vllm",)])
def test_the_demo_configuration_follows_the_local_tritons_grpc_port(tmp_path: Path, demo_llms: tuple[str, ...]
                                                                     ) -> None:
    config = load_model_config(demo_llm_config(Settings(cache_dir=tmp_path, triton_grpc_port=9101), demo_llms))
    entries = [*config.llm, *config.embedding, *config.rerank]
    assert entries and {entry.triton_grpc_url for entry in entries} == {"127.0.0.1:9101"}
    assert len(config.llm) == len(demo_llms)
    own = tmp_path / "mine.json"
    assert demo_llm_config(Settings(config_file=own, triton_grpc_port=9101), demo_llms) == own


@pytest.mark.parametrize(("flat", "words"), [
    ([5, 6, 7, 2, 3, -1], [[5, 6], [7]]),
    ([0, -1], []),
    ([], []),
])
def test_trtllm_word_lists(flat: list[int], words: list[list[int]]) -> None:
    assert word_list(flat) == words


@pytest.mark.parametrize(("flat", "message"), [
    ([5, 6, 7], "odd length"),
    ([5, 6, 3, -1], "out-of-bound offsets"),
    ([5, 6, 7, 2, 1, -1], "non-increasing offsets"),
    ([5, 6, -1, 2], "additional -1s"),
])
def test_trtllm_rejects_malformed_word_lists(flat: list[int], message: str) -> None:
    with pytest.raises(RequestError, match=message):
        word_list(flat)


def _inputs(**tensors: Any) -> Inputs:
    return Inputs(lambda name: tensors.get(name), batch_size=1)


def test_trtllm_request_defaults() -> None:
    [item] = parse_items(_inputs(request_output_len=np.array([[8]], np.int32)), [[1, 2, 3]], end_id=None,
                         exclude_input=False, vocab_size=100, max_positions=64)
    s = item.sampling
    assert (s.max_new_tokens, s.end_ids, s.greedy, s.seed, item.exclude_input) == (8, (), True, 0, False)
    [item] = parse_items(_inputs(request_output_len=np.array([[8]], np.int32), end_id=np.array([[2]], np.int32),
                                 runtime_top_k=np.array([[40]], np.int32)),
                         [[1]], end_id=None, exclude_input=True, vocab_size=100, max_positions=64)
    assert (item.sampling.end_ids, item.sampling.greedy, item.exclude_input) == ((2,), False, True)
    with pytest.raises(RequestError, match="maximum sequence length"):
        parse_items(_inputs(request_output_len=np.array([[64]], np.int32)), [[1]], end_id=None, exclude_input=False,
                    vocab_size=100, max_positions=64)


def test_incremental_decoding_never_splits_a_character(tokenizer: Any) -> None:
    text = " café 日本"
    ids = tokenizer.encode(text, add_special_tokens=False)
    decoder = IncrementalDecoder(tokenizer)
    pieces = [decoder.add([token]) for token in ids] + [decoder.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)
    assert "" in pieces  # a token holding only part of a character yields nothing yet
