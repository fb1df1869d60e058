"""What every adapter reads from a Triton model's configuration and how it builds request tensors.

A Triton model's configuration (`get_model_config`, JSON) says which inputs exist, with which data types
and whether tensors carry a batch dimension (`max_batch_size` > 0). Adapters send only the inputs a
model declares, with the declared types, so one adapter serves every version of a backend; optional
inputs that were renamed between versions are found by trying their names in order (`first`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc
import numpy as np
from tritonclient.utils import triton_to_np_dtype

from services.common.errors import ServiceError

REPLACEMENT = "\ufffd"  # what a decoder makes of an incomplete UTF-8 sequence

MAX_PRIORITY = 100  # requests take -100 to 100 (GenerateRequest.priority)


def data_type(tensor: Mapping[str, Any]) -> str:
    """The tensor's Triton type without the TYPE_ prefix; the configuration's STRING is BYTES on the wire."""
    kind = str(tensor.get("data_type", "")).removeprefix("TYPE_")
    return "BYTES" if kind == "STRING" else kind


def encode_words(words: Sequence[Sequence[int]]) -> np.ndarray:
    """FT's and TensorRT-LLM's word list for a batch of one: [1, 2, N] INT32, row 0 the words' ids
    concatenated (padded with 0), row 1 the cumulative end offset of each word (padded with -1). Empty
    words are dropped, so offsets strictly increase, the -1 padding is only at the end and the total is
    even, as TensorRT-LLM checks. No words: [[[0], [-1]]] (FT's "empty list"; TensorRT-LLM gets none)."""
    flat = [token for word in words for token in word]
    ends = np.cumsum([len(word) for word in words if word], dtype=np.int64).tolist()
    width = max(len(flat), 1)
    array = np.zeros((1, 2, width), dtype=np.int32)
    array[0, 1, :] = -1
    array[0, 0, : len(flat)] = flat
    array[0, 1, : len(ends)] = ends
    return array


def triton_priority(levels: int, priority: int) -> int:
    """Triton's priority level (1 the highest, `levels` the lowest, 0 the model's default) of a request's
    priority (-100 to 100, lower first; above 100 the gateway's own batch work, the lowest level): 0 for a
    model without levels or a request without a priority, else spread evenly over the levels."""
    if levels <= 0 or priority == 0:
        return 0
    if priority > MAX_PRIORITY:
        return levels
    return 1 + round((priority + MAX_PRIORITY) * (levels - 1) / (2 * MAX_PRIORITY))


def max_beam_width(triton_config: Mapping[str, Any]) -> int | None:
    """The model's `max_beam_width` parameter (TensorRT-LLM's `tensorrt_llm` model has it; any model may
    set it), None where its configuration sets none."""
    value = ModelInterface(triton_config).parameters.get("max_beam_width", "").strip()
    return int(value) if value.isdigit() else None


def beam_tokens(output_ids: np.ndarray, lengths: np.ndarray, skip: int = 0) -> list[list[int]]:
    """Each beam's tokens from `output_ids` [1, beams, width] and `sequence_length` [1, beams] (positions
    past a beam's length are padding), without the first `skip` (the prompt, where the output has it)."""
    rows = output_ids.reshape(-1, output_ids.shape[-1])
    return [[int(t) for t in row[skip:int(length)]] for row, length in zip(rows, lengths.reshape(-1), strict=True)]


def refuse(model: str, message: str) -> ServiceError:
    """A Triton model the adapter cannot drive: the llm service reports it not ready and logs why."""
    return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, f"Triton model `{model}` {message}")


class ModelInterface:
    """The tensors one Triton model declares, and request tensors shaped and typed as it expects."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.inputs: dict[str, str] = {t["name"]: data_type(t) for t in config.get("input", [])}
        self.outputs: dict[str, str] = {t["name"]: data_type(t) for t in config.get("output", [])}
        self.batched = int(config.get("max_batch_size", 0) or 0) > 0
        self.decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
        self.parameters = {key: str(value.get("string_value", "")) if isinstance(value, Mapping) else str(value)
                           for key, value in (config.get("parameters") or {}).items()}
        self.priority_levels = int((config.get("dynamic_batching") or {}).get("priority_levels", 0) or 0)

    def triton_priority(self, priority: int) -> int:
        return triton_priority(self.priority_levels, priority)

    def has(self, name: str) -> bool:
        return name in self.inputs

    def first(self, *names: str) -> str | None:
        """The first of `names` the model declares (inputs renamed between versions: new name first)."""
        return next((name for name in names if name in self.inputs), None)

    def missing(self, inputs: Iterable[str] = (), outputs: Iterable[str] = ()) -> list[str]:
        return [n for n in inputs if n not in self.inputs] + [n for n in outputs if n not in self.outputs]

    def dtype(self, name: str) -> Any:
        kind = self.inputs[name]
        return np.object_ if kind == "BYTES" else triton_to_np_dtype(kind)

    def tensor(self, name: str, values: Sequence[Any]) -> np.ndarray:
        """Input `name` holding `values` (a batch of one where the model batches), in the declared type."""
        dtype = self.dtype(name)
        if dtype is np.object_:
            values = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
        array = np.array(values, dtype=dtype)
        return array[np.newaxis] if self.batched else array

    def scalars(self, values: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """One-element inputs ([1, 1] batched, [1] otherwise) for the names the model declares; the rest
        (and None values) are left out."""
        return {name: self.tensor(name, [value]) for name, value in values.items()
                if value is not None and name in self.inputs}

    def check_constants(self, model: str, constants: Mapping[str, float]) -> None:
        """`triton_inputs` of the model configuration must name inputs the Triton model has."""
        unknown = [name for name in constants if name not in self.inputs]
        if unknown:
            raise refuse(model, f"has no input {', '.join(unknown)} (named in `triton_inputs` of the model config)")


def text_value(array: np.ndarray) -> str:
    """The first element of a BYTES output as text (backends send whole characters, or U+FFFD)."""
    value = array.reshape(-1)[0] if array.size else b""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def int_value(array: np.ndarray | None) -> int | None:
    return int(array.reshape(-1)[0]) if array is not None and array.size else None


class CumulativeText:
    """Deltas from responses that each carry the whole text so far (TensorRT-LLM BLS with
    `accumulate_tokens`, vLLM before r24.03). A trailing U+FFFD is an incomplete character the next
    response completes, so it is held back until then, or until the end."""

    def __init__(self, skip: int = 0) -> None:
        self.sent = skip  # characters of the cumulative text already passed on (e.g. an echoed prompt)
        self.last = ""

    def delta(self, text: str) -> str:
        self.last = text
        stable = len(text.rstrip(REPLACEMENT))
        if stable <= self.sent:
            return ""
        piece, self.sent = text[self.sent:stable], stable
        return piece

    def rest(self) -> str:
        """What was held back when the stream ends."""
        piece = self.last[self.sent:]
        self.sent = max(self.sent, len(self.last))
        return piece
