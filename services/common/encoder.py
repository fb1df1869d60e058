"""Encoder models on Triton (embedding and rerank): token rows in, one output row per input out.

Rows of concurrent requests are merged into Triton calls of at most the model's batch size (see
Batcher), so many small requests cost Triton one call, and a large request is split over several.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from tritonclient.utils import triton_to_np_dtype

from services.common.errors import ServiceError
from services.common.metrics import BATCH_SIZE, Stages
from services.common.server import ServedModel
from services.common.tokenizer import load_tokenizer
from services.common.triton import Triton
from tritongate.batching import Batches, Item
from tritongate.config import EncoderEntry
from tritongate.logs import REQUEST_ID

# Tensor names tritongate uses; `input_config` maps them to the Triton model's names.
STANDARD_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
DEFAULT_BATCH = 64


# LangChain's OpenAIEmbeddings sends tiktoken (cl100k) token ids by default, which are not the model's.
_TIKTOKEN_HINT = (". Token ids must come from this model's tokenizer: LangChain's OpenAIEmbeddings sends "
                  "OpenAI's tiktoken ids unless created with check_embedding_ctx_length=False (or "
                  "tiktoken_enabled=False with this model's tokenizer).")


@dataclass
class Row:
    """One tokenized input."""

    input_ids: list[int]
    token_type_ids: list[int] | None = None


PostProcess = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""(Triton output for a padded chunk, its attention mask) → one row per input."""


class Batcher(Batches[Sequence[Row], np.ndarray]):
    """Continuous batching for encoder calls, as TEI and Infinity do it (tritongate/batching.py): rows
    submitted in one turn of the event loop leave after that turn, spread over the model's idle
    `instances`, each Triton call at most `batch_size` rows (`max_size`); while this process is busy, at
    most `slots` calls are in flight, and what arrives meanwhile leaves together when a call ends.

    A call runs in its own context with REQUEST_ID set to the distinct ids of the requests it serves
    (`tritongate.batching.joined_id`), for its log lines and the Triton request id.
    """

    def __init__(self, call: Callable[[list[Row]], Awaitable[np.ndarray]], batch_size: int, slots: int,
                 model: str = "", instances: int = 1, busy: Callable[[], bool] | None = None) -> None:
        super().__init__(self._call, slots, batch_size, instances=instances, busy=busy)
        self.infer = call
        self.model = model

    def parts(self, rows: Sequence[Row]) -> list[Item[Sequence[Row], np.ndarray]]:
        """`rows` as the items to `send`: equal parts (100 rows with batch size 64: 50 + 50, not 64 + 36),
        at least one per instance, so that the instances share the work and finish together. Their
        `held_s` is how long they wait here."""
        if not rows:
            return []
        count = max(math.ceil(len(rows) / self.max_size), min(self.instances, len(rows)))
        size = math.ceil(len(rows) / count)
        return [Item(rows[i:i + size], len(rows[i:i + size])) for i in range(0, len(rows), size)]

    async def submit(self, rows: Sequence[Row], stages: Stages | None = None) -> np.ndarray:
        """The call's output rows for `rows`, in order (no rows: no call, and a (0, 0) array); onto `stages`,
        how long they waited (until the last of their calls left) and the time since (inference)."""
        parts = self.parts(rows)
        output = await self.send(parts)
        if stages is not None and parts:
            started = max(part.sent or part.submitted for part in parts)
            stages.queue, stages.inference = started - parts[0].submitted, time.monotonic() - started
        return output

    async def send(self, parts: Sequence[Item[Sequence[Row], np.ndarray]]) -> np.ndarray:
        """The output rows for `parts` (from `parts()`), in order."""
        if not parts:
            return np.zeros((0, 0), dtype=np.float32)
        results = await self.run(parts)
        return results[0] if len(results) == 1 else np.concatenate(results)

    async def _call(self, parts: list[Item[Sequence[Row], np.ndarray]]) -> list[np.ndarray]:
        rows = [row for part in parts for row in part.payload]
        BATCH_SIZE.labels(self.model).observe(len(rows))
        output = await self.infer(rows)
        bounds = itertools.accumulate((part.size for part in parts), initial=0)
        return [output[start:end] for start, end in itertools.pairwise(bounds)]


def instance_count(triton_config: dict[str, Any]) -> int:
    """How many instances of the model Triton runs (its `instance_group`s: `count` per listed GPU)."""
    groups = triton_config.get("instance_group") or []
    return sum(max(1, int(g.get("count") or 1)) * max(1, len(g.get("gpus") or ())) for g in groups) or 1


class EncoderModel(ServedModel):
    """What embedding and rerank models share: tokenizer, tensor layout and batched inference."""

    entry: EncoderEntry

    def __init__(self, entry: EncoderEntry, triton: Triton) -> None:
        super().__init__(entry, triton)
        self.tokenizer = load_tokenizer(entry.path, entry.name)
        self.vocab_size = len(self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.max_tokens = entry.max_tokens
        self.batch_size = entry.max_batch_size or DEFAULT_BATCH
        self.inputs: dict[str, tuple[str, Any]] = {}  # our name → (Triton name, numpy dtype)
        self.output_name = ""
        self.output_dims: list[int] = []
        self.instances = 1  # of the Triton model on each endpoint
        self.post: PostProcess = lambda output, mask: output
        self.batcher = Batcher(self._infer, self.batch_size, entry.max_concurrent_batches, entry.name)

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
        self.batcher.max_size = self.batch_size
        self.instances = instance_count(triton_config)

    async def refresh(self) -> bool:
        ready = await super().refresh()
        # Each Triton call runs on one instance of one endpoint: the batcher spreads rows over them all.
        self.batcher.instances = self.instances * max(1, len(self.triton_pool.ready()))
        return ready

    def configured_output(self) -> str | None:
        raise NotImplementedError

    def encode_many(self, requests: Sequence[Any]) -> Sequence[Any]:
        """Tokenize the requests of a batch RPC together (services/common/batch.py)."""
        raise NotImplementedError

    async def serve(self, request: Any, timeout: float | None, encoded: Any = None, stages: Stages | None = None
                    ) -> Any:
        """The answer to one request (`encoded`: its tokens from `encode_many`, when tokenized already, in
        the time `stages` holds), with where its time went."""
        raise NotImplementedError

    async def serve_many(self, requests: Sequence[Any], timeout: float | None) -> list[Any]:
        """The answers to the requests of a batch RPC (each an answer or its own exception), tokenized
        together (each one's tokenization is that call's time), then served concurrently; their rows merge
        in the batcher."""
        together = Stages()
        with together.tokenizing():
            encoded = self.encode_many(requests)
        return await asyncio.gather(*(self.serve(request, timeout, each, dataclasses.replace(together))
                                      for request, each in zip(requests, encoded, strict=True)),
                                    return_exceptions=True)

    def check_token_ids(self, rows: Sequence[Sequence[int]], param: str) -> None:
        for i, ids in enumerate(rows):
            bad = next((t for t in ids if t >= self.vocab_size), None)
            if bad is not None:
                raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"{param}[{i}] contains token id {bad}, outside the vocabulary of "
                                   f"`{self.name}` (0..{self.vocab_size - 1})"
                                   f"{_TIKTOKEN_HINT if param == 'input' else ''}", param)

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

    async def _infer(self, rows: list[Row]) -> np.ndarray:
        """One Triton call for rows of possibly many requests, post-processed to one row per input."""
        tensors, mask = self._tensors(rows)
        result = await self.triton.infer(self.triton_pool, self.triton_name, tensors, [self.output_name],
                                         request_id=REQUEST_ID.get())  # the batch's ids (see Batcher)
        return self.post(result[self.output_name], mask)

    async def run(self, rows: Sequence[Row], timeout: float | None, stages: Stages | None = None) -> np.ndarray:
        """Infer all rows (through the batcher); returns post-processed outputs in the rows' order (their
        queue and inference time onto `stages`)."""
        await self.ensure_ready()
        order = np.argsort([len(row.input_ids) for row in rows], kind="stable")  # neighbours pad alike
        try:
            async with asyncio.timeout(timeout):  # no task of its own, unlike wait_for
                by_length = await self.batcher.submit([rows[i] for i in order], stages)
        except TimeoutError:
            raise ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"model `{self.name}` did not answer within the deadline") from None
        output = np.empty_like(by_length)
        output[order] = by_length
        return output
