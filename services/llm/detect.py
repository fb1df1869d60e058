"""Which adapter drives a Triton model: the one `backend` in the model config names, else the one its own
Triton configuration matches. The configuration is known only once the Triton model is ready, so the
choice is made there (`ModelBackend.configure`), again each time the model becomes ready.

Detection, first match wins:
- `backend: "fastertransformer"`, `"tensorrtllm"` or `"vllm"` names the adapter;
- `text_input` with `sampling_parameters`: vLLM; `text_input` with `max_tokens`: TensorRT-LLM's ensemble or
  BLS model (`tensorrt_llm_text`);
- `input_ids`, `input_lengths` and `request_output_len`: TensorRT-LLM (`tensorrt_llm`) when there is a
  `streaming` input or `input_ids` is INT32, FasterTransformer when `input_ids` is UINT32 (FT's, and what
  Python models speaking FT's interface declare).
Anything else is refused with what was found.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, Literal

import grpc

from services.common.errors import ServiceError
from services.common.triton import Triton
from services.common.triton_pool import TritonPool
from services.llm.backends import Knob, LlmBackend, Sampling, Step
from services.llm.fastertransformer import FasterTransformer
from services.llm.tensorrt_llm import TensorRTLLM
from services.llm.tensorrt_llm_text import TensorRTLLMText
from services.llm.tensors import ModelInterface, refuse
from services.llm.vllm import Vllm
from tritongate.config import LlmModel

BackendName = Literal["fastertransformer", "tensorrt_llm", "tensorrt_llm_text", "vllm"]
_BY_TRITON_BACKEND: dict[str, BackendName] = {"fastertransformer": "fastertransformer",
                                              "tensorrtllm": "tensorrt_llm", "vllm": "vllm"}
_INTERFACES = ("FasterTransformer (input_ids UINT32, input_lengths, request_output_len), TensorRT-LLM "
               "(input_ids INT32, input_lengths, request_output_len, streaming), TensorRT-LLM ensemble or BLS "
               "(text_input, max_tokens), vLLM (text_input, sampling_parameters)")


def detect_backend(triton_config: Mapping[str, Any], model: str) -> BackendName:
    """The adapter for a Triton model configuration (see the module docstring); FAILED_PRECONDITION naming
    what was found when none fits."""
    found = _BY_TRITON_BACKEND.get(str(triton_config.get("backend", "")))
    if found:
        return found
    interface = ModelInterface(triton_config)
    if interface.has("text_input"):
        if interface.has("sampling_parameters"):
            return "vllm"
        if interface.has("max_tokens"):
            return "tensorrt_llm_text"
    elif not interface.missing(("input_ids", "input_lengths", "request_output_len")):
        if interface.has("streaming") or interface.inputs["input_ids"] == "INT32":
            return "tensorrt_llm"
        if interface.inputs["input_ids"] == "UINT32":
            return "fastertransformer"
    kind = f"backend `{triton_config['backend']}`" if triton_config.get("backend") else \
        f"platform `{triton_config.get('platform', '?')}`"
    inputs = ", ".join(f"{name} {kind_}" for name, kind_ in interface.inputs.items()) or "none"
    raise refuse(model, f"({kind}; inputs: {inputs}) matches none of the LLM interfaces tritongate speaks: "
                 f"{_INTERFACES}. Set `backend` in the model config if it is one of them (docs/backends.md).")


def _adapter(name: BackendName, entry: LlmModel, triton: Triton, pool: TritonPool) -> LlmBackend:
    model, constants = entry.triton_name, entry.triton_inputs
    makers: dict[BackendName, Callable[[], LlmBackend]] = {
        "fastertransformer": lambda: FasterTransformer(triton, pool, model, constants),
        "tensorrt_llm": lambda: TensorRTLLM(triton, pool, model, constants, entry.tokens_per_block),
        "tensorrt_llm_text": lambda: TensorRTLLMText(triton, pool, model, constants, entry.accumulate_tokens,
                                                     entry.tokens_per_block),
        "vllm": lambda: Vllm(triton, pool, model, constants, entry.lora_name),
    }
    return makers[name]()


class ModelBackend:
    """The backend of one model: it forwards to the adapter chosen when the Triton model became ready, so
    that the model's `GenerationPolicy` can hold it from the start."""

    def __init__(self, entry: LlmModel, triton: Triton, pool: TritonPool) -> None:
        self.entry = entry
        self.triton = triton
        self.pool = pool  # the model's Triton endpoints, which its adapter streams from
        self.adapter: LlmBackend | None = None

    @property
    def name(self) -> str:
        return self.adapter.name if self.adapter else self.entry.backend or "undetected"

    @property
    def takes_text(self) -> bool:
        return self.adapter.takes_text if self.adapter else False

    @property
    def beam_widths(self) -> Sequence[int]:
        """The adapter's, up to the model config's `max_beams`."""
        widths = self.adapter.beam_widths if self.adapter else ()
        limit = self.entry.max_beams
        return [width for width in widths if limit is None or width <= limit]

    def configure(self, triton_config: dict[str, Any]) -> None:
        name = self.entry.backend or detect_backend(triton_config, self.entry.triton_name)
        adapter = self.adapter if self.adapter and self.adapter.name == name else \
            _adapter(name, self.entry, self.triton, self.pool)
        adapter.configure(triton_config)
        self.adapter = adapter

    def supports(self, knob: Knob) -> bool:
        return self.adapter is not None and self.adapter.supports(knob)

    def stream(self, prompt: Sequence[int], sampling: Sampling, timeout: float | None, text: str = ""
               ) -> AsyncGenerator[Step, None]:
        if self.adapter is None:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, f"model `{self.entry.name}` is not ready")
        return self.adapter.stream(prompt, sampling, timeout, text)
