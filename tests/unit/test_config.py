"""The model configuration file: Denglin's openai_api format accepted unchanged, tritongate's extensions,
and errors that name the JSON path."""

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tritongate.config import ConfigError, ModelInfo, load_model_config, parse_model_config
from tritongate.wire import DEFAULT_MAX_N, MAX_N

DATA = Path(__file__).parent / "data"
DENGLIN_EXAMPLE = DATA / "denglin_model_config.json"  # the example file of Denglin's openai_api


def test_denglin_example_file_is_accepted_unchanged() -> None:
    config = load_model_config(DENGLIN_EXAMPLE)
    assert [m.name for m in config.llm] == ["chatglm2-6b"]
    info = config.model_info("chatglm2-6b")
    assert info.end_id == -2 and info.max_len == 2048
    assert info.bad_words == [[7768], [3908]]  # FT's two-row layout [[7768, 3908], [1, 2]], read as words
    assert info.stop_words == [[2], [2]] and info.mask_positions == 1
    embedding = config.embedding[0]
    assert embedding.max_tokens == 512 and embedding.path == "/LocalRun/model_zoo/bge-large-zh-v1.5"
    rerank = config.rerank[0]
    assert rerank.input_config == {"input_ids": "input_ids", "attention_mask": "attention_mask"}
    assert rerank.output_config.name == "logits" and rerank.output_config.process == "normalize"
    # The chat template is named relative to the config file; it does not exist here, so the model
    # folder is the fallback.
    assert config.llm[0].chat_template == "/LocalRun/void_main_ft_with_llama/chatglm2-6b/chatglm2.jinja"


def test_denglin_http_port_maps_to_triton_grpc_port() -> None:
    config = load_model_config(DENGLIN_EXAMPLE)
    assert config.embedding[0].triton_grpc_url == "127.0.0.1:8001"
    assert config.llm[0].triton_grpc_url == "127.0.0.1:8001"
    config.embedding[0].grpc_url = "triton:9001"
    assert config.embedding[0].triton_grpc_url == "triton:9001"


def test_defaults_for_extensions() -> None:
    config = parse_model_config({"embedding": [{"name": "e", "url": "http://h:8001/", "path": "/m"}]})
    entry = config.embedding[0]
    assert entry.url == "h:8001" and entry.triton_name == "e"
    assert entry.pooling == "auto" and entry.normalize and entry.truncate and entry.max_tokens == 512
    llm = parse_model_config({"llm": [{"name": "l", "url": "u", "path": "/m"}]}).llm[0]
    assert llm.max_n == DEFAULT_MAX_N and llm.max_choices == 64 and llm.max_completion_tokens is None
    assert llm.backend is None  # detected from the Triton model's configuration
    assert llm.accumulate_tokens is None and llm.lora_name is None
    assert ModelInfo(name="l").max_completion_tokens is None  # a request without max_tokens: the rest of the context


@pytest.mark.parametrize("backend", ["fastertransformer", "tensorrt_llm", "tensorrt_llm_text", "vllm", None])
def test_an_llm_backend_may_be_named(backend: str | None) -> None:
    entry = {"name": "l", "url": "u", "path": "/m", "backend": backend, "accumulate_tokens": True, "lora_name": "a"}
    llm = parse_model_config({"llm": [entry]}).llm[0]
    assert (llm.backend, llm.accumulate_tokens, llm.lora_name) == (backend, True, "a")


@pytest.mark.parametrize(("value", "words"), [
    ([[7768, 3908], [1, 2]], [[7768], [3908]]),  # FT's layout, as in Denglin's example
    ([[2], [2]], [[2], [2]]),  # Denglin's stop_words: not offsets into one id, so two words
    ([[5, 6, 7], [2, 3, -1]], [[5, 6], [7]]),
    ([[1, 2, 3]], [[1, 2, 3]]),
    ([[4, 5], [6], []], [[4, 5], [6]]),
    (None, []),
])
def test_word_lists_in_either_layout_become_lists_of_words(value: Any, words: list[list[int]]) -> None:
    info = ModelInfo(name="m", bad_words=value, stop_words=value)
    assert info.bad_words == words and info.stop_words == words
    assert ModelInfo(name="m").stop_words == []


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"embedding": [{"name": "e", "url": "u", "path": "p", "max_tokens": "many"}]},
         "$.embedding[0].max_tokens: Input should be a valid integer"),
        ({"embedding": [{"name": "e", "path": "p"}]}, "$.embedding[0].url: Field required"),
        ({"rerank": [{"name": "r", "url": "u", "path": "p", "output_config": {"process": "sigmoid"}}]},
         "$.rerank[0].output_config.process: Input should be 'normalize', 'none' or 'softmax'"),
        ({"embedding": [{"name": "e", "url": "u", "path": "p", "pooling": "max"}]},
         "$.embedding[0].pooling: Input should be"),
        ({"llm": [{"name": "x", "url": "u", "path": "p"}], "embedding": [{"name": "x", "url": "u", "path": "p"}]},
         "$.embedding[0].name: model id 'x' is already used at $.llm[0].name"),
        ({"model_infos": [{"name": "x", "max_len": 0}]}, "$.model_infos[0].max_len: Input should be greater than 0"),
        ({"model_infos": [{"name": "x", "max_completion_tokens": 0}]},
         "$.model_infos[0].max_completion_tokens: Input should be greater than 0"),
        ({"llm": [{"name": "x", "url": "u", "path": "p", "max_n": MAX_N + 1}]},
         f"$.llm[0].max_n: Input should be less than or equal to {MAX_N}"),
        ({"model_infos": [{"name": "x", "stop_words": [["a"]]}]}, "$.model_infos[0].stop_words[0][0]: Input should"),
        ({"llm": [{"name": "x", "url": "u", "path": "p", "backend": "tgi"}]},
         "$.llm[0].backend: Input should be 'fastertransformer', 'tensorrt_llm', 'tensorrt_llm_text' or 'vllm'"),
        ([1, 2], "$: Input should be a valid dictionary"),
    ],
)
def test_bad_config_names_json_path(data: object, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_model_config(data, "model_config.json")
    assert expected in str(info.value)
    assert str(info.value).startswith("model_config.json: ")


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_model_config(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"llm": [}')
    with pytest.raises(ConfigError, match=r"not valid JSON: .* line 1 column 10"):
        load_model_config(broken)


def test_paths_expand_variables_and_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITONGATE_MODELS_DIR", "/srv/models")
    file = tmp_path / "conf.json"
    file.write_text(json.dumps({"embedding": [
        {"name": "a", "url": "u", "path": "${TRITONGATE_MODELS_DIR}/minilm"},
        {"name": "b", "url": "u", "path": "models/bge"},
    ]}))
    config = load_model_config(file)
    assert config.embedding[0].path == "/srv/models/minilm"
    assert config.embedding[1].path == str(tmp_path / "models" / "bge")


def test_unknown_keys_are_reported_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    parse_model_config({"embedding": [{"name": "e", "url": "u", "path": "p", "vendor_knob": 1}]}, "f.json")
    assert "ignoring unknown key $.embedding[0].vendor_knob" in caplog.text


def test_hosted_tools_and_tokens_per_block() -> None:
    llm = parse_model_config({"llm": [{"name": "l", "url": "u", "path": "/m"}]}).llm[0]
    assert llm.hosted_tools == "ignore" and llm.tokens_per_block == 64  # TensorRT-LLM's default block
    entry = {"name": "l", "url": "u", "path": "/m", "hosted_tools": "refuse", "tokens_per_block": 32}
    llm = parse_model_config({"llm": [entry]}).llm[0]
    assert (llm.hosted_tools, llm.tokens_per_block) == ("refuse", 32)
    for bad, says in (({"hosted_tools": "run"}, "$.llm[0].hosted_tools: Input should be 'ignore' or 'refuse'"),
                      ({"tokens_per_block": 0}, "$.llm[0].tokens_per_block: Input should be greater than 0")):
        with pytest.raises(ConfigError, match=re.escape(says)):
            parse_model_config({"llm": [{"name": "l", "url": "u", "path": "/m", **bad}]})
