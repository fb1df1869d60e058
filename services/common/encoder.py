"""Encoder models on Triton (embedding and rerank): token rows in, one output row per input out.

Rows are sorted by length, split into Triton requests of at most the model's batch size, padded per
request (little padding, since neighbours have similar lengths), sent concurrently so Triton can batch
and spread them over instances, and put back in the caller's order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.utils import triton_to_np_dtype

from services.common.errors import ServiceError
from services.common.server import ServedModel
from services.common.tokenizer import load_tokenizer
from services.common.triton import Triton
from tritongate.config import EmbeddingModel, RerankModel

import grpc

# Tensor names tritongate uses; `input_config` maps them to the Triton model's names.
STANDARD_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
DEFAULT_BATCH = 64


@dataclass
class Row:
    """One tokenized input."""

    input_ids: list[int]
    token_type_ids: list[int] | None = None


PostProcess = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""(Triton output for a padded chunk, its attention mask) → one row per input."""


class EncoderModel(ServedModel):
    """What embedding and rerank models share: tokenizer, tensor layout and batched inference."""

    entry: EmbeddingModel | RerankModel

    def __init__(self, entry: EmbeddingModel | RerankModel, triton: Triton) -> None:
        super().__init__(entry, triton)
        self.tokenizer = load_tokenizer(entry.path, entry.name)
        self.vocab_size = len(self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.max_tokens = entry.max_tokens
        self.batch_size = entry.max_batch_size or DEFAULT_BATCH
        self.inputs: dict[str, tuple[str, Any]] = {}  # our name → (Triton name, numpy dtype)
        self.output_name = ""
        self.output_dims: list[int] = []

    def on_ready(self, triton_config: dict[str, Any]) -> None:
        declared = {tensor["name"]: tensor for tensor in triton_config.get("input", [])}
        mapping = {name: self.entry.input_config.get(name, name) for name in STANDARD_INPUTS}
        self.inputs = {
            ours: (theirs, triton_to_np_dtype(declared[theirs]["data_type"].removeprefix("TYPE_")))
            for ours, theirs in mapping.items()
            if theirs in declared
        }
        if "input_ids" not in self.inputs:
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"Triton model `{self.triton_name}` has no input `{mapping['input_ids']}` "
                               "(set `input_config` in the model configuration)")
        outputs = {tensor["name"]: tensor for tensor in triton_config.get("output", [])}
        self.output_name = self.configured_output() or next(iter(outputs), "")
        self.output_dims = [int(d) for d in outputs.get(self.output_name, {}).get("dims", [])]
        self.batch_size = self.entry.max_batch_size or int(triton_config.get("max_batch_size") or 0) or 1

    def configured_output(self) -> str | None:
        raise NotImplementedError

    def check_token_ids(self, rows: Sequence[Sequence[int]], param: str) -> None:
        for i, ids in enumerate(rows):
            bad = next((t for t in ids if t >= self.vocab_size), None)
            if bad is not None:
                raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"{param}[{i}] contains token id {bad}, outside the vocabulary of "
                                   f"`{self.name}` (0..{self.vocab_size - 1})", param)

    def _tensors(self, chunk: Sequence[Row]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        width = max(len(row.input_ids) for row in chunk)
        ids = np.full((len(chunk), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(chunk), width), dtype=np.int64)
        types = np.zeros((len(chunk), width), dtype=np.int64)
        for i, row in enumerate(chunk):
            n = len(row.input_ids)
            ids[i, :n] = row.input_ids
            mask[i, :n] = 1
            if row.token_type_ids is not None:
                types[i, :n] = row.token_type_ids
        arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        tensors = {theirs: arrays[ours].astype(dtype, copy=False) for ours, (theirs, dtype) in self.inputs.items()}
        return tensors, mask

    async def ensure_ready(self) -> None:
        if not self.ready and not await self.refresh():
            raise ServiceError(grpc.StatusCode.UNAVAILABLE,
                               f"model `{self.name}` is not ready in Triton at {self.url}")

    async def run(self, rows: Sequence[Row], post: PostProcess, timeout: float | None) -> np.ndarray:
        """Infer all rows; returns post-processed outputs stacked in the rows' order."""
        await self.ensure_ready()
        order = sorted(range(len(rows)), key=lambda i: len(rows[i].input_ids))
        spans = [order[start:start + self.batch_size] for start in range(0, len(order), self.batch_size)]

        async def infer(span: list[int]) -> np.ndarray:
            tensors, mask = self._tensors([rows[i] for i in span])
            result = await self.triton.infer(self.url, self.triton_name, tensors, [self.output_name], timeout)
            return post(result[self.output_name], mask)

        chunks = await asyncio.gather(*(infer(span) for span in spans))
        out = np.empty((len(rows), *chunks[0].shape[1:]), dtype=chunks[0].dtype)
        for span, chunk in zip(spans, chunks, strict=True):
            out[span] = chunk
        return out
