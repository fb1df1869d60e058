"""LoRA adapters: what each backend is sent to run a request on one (`llm[].lora_adapters` of the model
config), and TensorRT-LLM's adapter cache as seen from here.

vLLM names an adapter (`lora_name` in `sampling_parameters`; the backend's `multi_lora.json` has it).
TensorRT-LLM (the `tensorrt_llm` model, its ensemble and BLS model) takes `lora_task_id`, and the first
request of a task id also carries the weights: `lora_weights` and `lora_config`, the `.npy` files
TensorRT-LLM's `hf_lora_convert.py` writes, as Triton's OpenAI frontend sends them. The backend caches
them by task id; a later request with the id alone fails with "LoRA task <id> not found in cache" when
they are not there (evicted, Triton restarted, another Triton replica), and is then sent again with them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
import numpy as np

from services.common.errors import ServiceError
from services.llm.tensors import ModelInterface
from tritongate.config import LlmModel

T = TypeVar("T")
LORA_INPUTS = ("lora_task_id", "lora_weights", "lora_config")
# The adapter folder's files, as TensorRT-LLM's hf_lora_convert.py names them.
WEIGHT_FILES = {"lora_weights": "model.lora_weights.npy", "lora_config": "model.lora_config.npy"}
NOT_CACHED = re.compile(r"LoRA task \d+ not found in cache")


@dataclass(eq=False)
class Adapter:
    """One adapter of a model, in every backend's terms."""

    name: str  # its public id
    lora_name: str  # vLLM's name
    task_id: int  # TensorRT-LLM's
    path: str | None  # the folder of the TensorRT-LLM weights; None: the backend has them already
    _weights: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def weights(self) -> dict[str, np.ndarray]:
        """`lora_weights` and `lora_config` from the adapter's folder, read once (a missing file is the
        deployment's fault: FAILED_PRECONDITION)."""
        if not self._weights and self.path:
            try:
                self._weights = {name: np.load(Path(self.path) / file) for name, file in WEIGHT_FILES.items()}
            except (OSError, ValueError) as exc:
                raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION, f"LoRA adapter `{self.name}`: cannot read "
                                   f"its weights in {self.path}: {exc}") from None
        return self._weights


def task_id_of(path: str) -> int:
    """A task id for an adapter folder: the same on every start and every gateway replica that sees the
    folder at the same path, and different for different folders, so Triton's cache is never asked for
    another adapter's weights (a list position would change when the configuration does)."""
    return int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big") >> 1 or 1


def adapters_of(entry: LlmModel) -> dict[str, Adapter]:
    """Every model id that names one of the model's adapters → the adapter."""
    adapters = {name: Adapter(name, spec.lora_name or name,
                              spec.task_id or (task_id_of(spec.path) if spec.path else 0), spec.path)
                for name, spec in entry.lora_adapters.items()}
    return {model_id: adapters[name] for model_id, name in entry.adapter_ids().items()}


class TaskCache:
    """The TensorRT-LLM task ids whose weights this process has sent: a request for one sends the id alone."""

    def __init__(self) -> None:
        self.sent: set[int] = set()

    def tensors(self, adapter: Adapter | None, model: ModelInterface, resend: bool = False) -> dict[str, np.ndarray]:
        """`lora_task_id`, and `lora_weights` with `lora_config` unless this task's weights were sent before
        (and not `resend`), typed and shaped as `model` declares them; nothing without an adapter."""
        if adapter is None:
            return {}
        if not adapter.task_id:
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION, f"LoRA adapter `{adapter.name}` has neither "
                               "`path` nor `task_id` in the model config, one of which TensorRT-LLM needs")
        tensors = model.scalars({"lora_task_id": adapter.task_id})
        if adapter.path and (resend or adapter.task_id not in self.sent):
            self.sent.add(adapter.task_id)
            for name, array in adapter.weights().items():
                array = array.reshape(array.shape[-2:]).astype(model.dtype(name), copy=False)
                tensors[name] = array[np.newaxis] if model.batched else array
        return tensors

    async def stream(self, adapter: Adapter | None, model: ModelInterface,
                     start: Callable[[dict[str, np.ndarray]], AsyncIterator[T]]) -> AsyncIterator[T]:
        """`start(LoRA tensors)`'s items; when the backend answers, before anything else, that it does not
        have the task's weights, everything again from a request that carries them."""
        tensors = self.tensors(adapter, model)
        answered = False
        try:
            async for item in start(tensors):
                answered = True
                yield item
            return
        except ServiceError as exc:
            if answered or "lora_weights" in tensors or not tensors or not NOT_CACHED.search(exc.message):
                raise
        async for item in start(self.tensors(adapter, model, resend=True)):
            yield item


def has_lora_inputs(model: ModelInterface) -> bool:
    """Whether a TensorRT-LLM model (or its ensemble / BLS model) takes LoRA adapters."""
    return not model.missing(LORA_INPUTS)
