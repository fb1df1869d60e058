"""Which adapter drives a Triton model: detection from the Triton configurations docs/backends.md gives
(parsed as Triton parses config.pbtxt), refusals that name what was found, and the model's backend
following its Triton model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from services.common.errors import ServiceError
from services.llm.detect import ModelBackend, detect_backend
from tests.support.fake_triton import triton_config
from tritongate.config import LlmModel

DOC = Path(__file__).parents[2] / "docs" / "backends.md"
# What vllm_backend's auto_complete_config adds to a config that declares nothing (Triton reports the result).
VLLM_AUTO = triton_config({"text_input": "STRING", "stream": "BOOL", "sampling_parameters": "STRING",
                           "exclude_input_in_output": "BOOL", "return_finish_reason": "BOOL"},
                          {"text_output": "STRING", "finish_reason": "STRING"}, batched=False)


def doc_configs() -> list[tuple[str, dict[str, Any]]]:
    """Each config.pbtxt of the doc with the adapter it says it is detected as, in get_model_config's JSON."""
    found = []
    for block in re.findall(r"```protobuf\n(.*?)```", DOC.read_text(), flags=re.S):
        expected = re.search(r"# detected as: (\w+)", block)
        assert expected, block[:80]
        config = text_format.Parse(block, model_config_pb2.ModelConfig())
        found.append((expected[1], json_format.MessageToDict(config, preserving_proto_field_name=True)))
    return found


def entry(**fields: Any) -> LlmModel:
    return LlmModel(name="m", url="u", path="/m", **fields)


@pytest.mark.parametrize(("name", "config"), doc_configs(), ids=lambda value: value if isinstance(value, str) else "")
def test_the_documented_configurations_are_detected_and_accepted(name: str, config: dict[str, Any]) -> None:
    assert detect_backend(config, "m") == name
    backend = ModelBackend(entry(), None, None)  # type: ignore[arg-type]  # no Triton: detection needs none
    backend.configure({**VLLM_AUTO, **config} if name == "vllm" else config)
    assert backend.name == name


def test_every_adapter_is_documented() -> None:
    assert {name for name, _ in doc_configs()} == {"fastertransformer", "tensorrt_llm", "tensorrt_llm_text", "vllm"}


@pytest.mark.parametrize(("config", "name"), [
    (triton_config({"input_ids": "UINT32", "input_lengths": "UINT32", "request_output_len": "UINT32"}, {},
                   backend="python"), "fastertransformer"),
    (triton_config({"input_ids": "INT32", "input_lengths": "INT32", "request_output_len": "INT32"}, {},
                   backend="python"), "tensorrt_llm"),
    (triton_config({"input_ids": "UINT32", "input_lengths": "UINT32", "request_output_len": "UINT32",
                    "streaming": "BOOL"}, {}), "tensorrt_llm"),
    (triton_config({"text_input": "STRING", "max_tokens": "INT32"}, {}, platform="ensemble"), "tensorrt_llm_text"),
    (triton_config({"text_input": "STRING", "sampling_parameters": "STRING", "max_tokens": "INT32"}, {}), "vllm"),
    (triton_config({}, {}, backend="vllm"), "vllm"),  # the backend field first
])
def test_detection_rules(config: dict[str, Any], name: str) -> None:
    assert detect_backend(config, "m") == name


@pytest.mark.parametrize("config", [
    triton_config({"text_input": "STRING", "streaming": "BOOL", "sampling_param_max_tokens": "INT32"}, {},
                  backend="python"),  # TensorRT-LLM's llmapi model
    triton_config({"INPUT_0": "STRING", "INPUT_1": "UINT32"}, {}, platform="ensemble"),  # the 2023 ensemble
    triton_config({"input_ids": "INT64", "attention_mask": "INT64"}, {}, backend="onnxruntime"),
    triton_config({"input_ids": "FP32", "input_lengths": "UINT32", "request_output_len": "UINT32"}, {}),
])
def test_a_model_matching_no_interface_is_refused_naming_what_was_found(config: dict[str, Any]) -> None:
    with pytest.raises(ServiceError) as info:
        detect_backend(config, "m")
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    message = info.value.message
    assert message.startswith("Triton model `m` (") and "matches none of the LLM interfaces" in message
    first = config["input"][0]
    assert f"{first['name']} {first['data_type'].removeprefix('TYPE_').replace('STRING', 'BYTES')}" in message


def test_an_explicit_backend_is_not_detected_but_checked() -> None:
    ft = triton_config({"input_ids": "UINT32", "input_lengths": "UINT32", "request_output_len": "UINT32"},
                       {"output_ids": "UINT32", "sequence_length": "UINT32"})
    backend = ModelBackend(entry(backend="tensorrt_llm"), None, None)  # type: ignore[arg-type]
    assert backend.name == "tensorrt_llm" and not backend.supports("seed")  # not configured yet
    with pytest.raises(ServiceError, match="lacks the TensorRT-LLM tensors streaming"):
        backend.configure(ft)


def test_the_backend_follows_the_triton_model_when_it_changes() -> None:
    backend = ModelBackend(entry(), None, None)  # type: ignore[arg-type]  # no Triton: detection needs none
    assert backend.name == "undetected" and not backend.takes_text
    backend.configure(triton_config({"input_ids": "UINT32", "input_lengths": "UINT32", "request_output_len": "UINT32"},
                                    {"output_ids": "UINT32", "sequence_length": "UINT32"}))
    assert backend.name == "fastertransformer" and not backend.takes_text
    backend.configure(triton_config({"text_input": "STRING", "sampling_parameters": "STRING"},
                                    {"text_output": "STRING"}, batched=False))
    assert backend.name == "vllm" and backend.takes_text and backend.supports("min_p")
