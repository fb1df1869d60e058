"""Encoder models on Triton (embedding and rerank): token rows in, one output row per input out.

Rows of concurrent requests are merged into Triton calls of at most the model's batch size (see
Batcher), so many small requests cost Triton one call, and a large request is split over several.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from tritonclient.utils import triton_to_np_dtype

from services.common.errors import ServiceError
from services.common.metrics import BATCH_SIZE, Stages
from services.common.server import ServedModel
from services.common.tokenizer import load_tokenizer
from services.common.triton import Triton
from tritongate.busy import ProcessBusy
from tritongate.config import EncoderEntry
from tritongate.logs import NO_REQUEST, REQUEST_ID

# Tensor names tritongate uses; `input_config` maps them to the Triton model's names.
STANDARD_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
DEFAULT_BATCH = 64
MAX_BATCH_IDS = 256  # characters of the merged request ids a batched Triton call carries


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


@dataclass
class _Waiting:
    rows: Sequence[Row]
    request_id: str
    result: asyncio.Future[np.ndarray] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    left: float = 0.0  # stage timings: when the Triton call with these rows started (time.perf_counter)


class Batcher:
    """Continuous batching for encoder calls, as TEI and Infinity do it.

    What is submitted in one turn of the event loop leaves after that turn (no timer: no added latency
    when idle), spread over the model's idle `instances` (Triton runs one call on one instance), each
    call at most `batch_size` rows. While this process is `busy` (tritongate/busy.py), at most `slots`
    Triton calls are in flight: what arrives while no slot is free waits, and leaves together when a
    call ends, so that many one-row requests cost this process few calls. With CPU to spare, every
    turn's rows leave at once: Triton's own batcher merges the calls that queue there as soon as an
    instance is free, where rows held here would reach it late, in smaller batches.

    A call runs with REQUEST_ID set to the distinct ids of the requests it serves, joined by ","
    (cut at MAX_BATCH_IDS characters), for its log lines and the Triton request id.
    """

    def __init__(self, call: Callable[[list[Row]], Awaitable[np.ndarray]], batch_size: int, slots: int,
                 model: str = "", instances: int = 1, busy: Callable[[], bool] | None = None) -> None:
        self.call = call
        self.model = model
        self.batch_size = batch_size
        self.slots = slots  # Triton calls in flight while busy
        self.busy = busy or ProcessBusy()
        self.instances = instances  # of the Triton model: how many calls it runs at once
        self._waiting: deque[_Waiting] = deque()
        self._in_flight = 0
        self._running: dict[asyncio.Task[None], list[_Waiting]] = {}  # Triton calls and whose rows they carry
        self._scheduled = False

    async def submit(self, rows: Sequence[Row], stages: Stages | None = None) -> np.ndarray:
        """The call's output rows for `rows`, in order (no rows: no call, and a (0, 0) array); the time
        they waited and the time of their call onto `stages`."""
        if not rows:
            return np.zeros((0, 0), dtype=np.float32)
        submitted = time.perf_counter()  # stage timings
        # Equal parts (100 rows with batch size 64: 50 + 50, not 64 + 36), at least one per instance, so
        # that the instances share the work and finish together.
        count = max(math.ceil(len(rows) / self.batch_size), min(self.instances, len(rows)))
        size = math.ceil(len(rows) / count)
        request_id = REQUEST_ID.get()
        parts = [_Waiting(rows[i:i + size], request_id) for i in range(0, len(rows), size)]
        self._waiting.extend(parts)
        if not self._scheduled:  # after this turn of the loop: rows submitted in the same turn leave together
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._dispatch)
        try:
            results = [await parts[0].result] if len(parts) == 1 else \
                await asyncio.gather(*(part.result for part in parts))
        finally:
            for part in parts:  # a cancelled caller's rows are skipped if they have not left yet
                part.result.cancel()
            self._drop_abandoned()
        if stages is not None:  # stage timings: queued until the last of its calls started, then inference
            started = max(part.left for part in parts)
            stages.queue, stages.inference = started - submitted, time.perf_counter() - started
        return results[0] if len(results) == 1 else np.concatenate(results)

    def _dispatch(self) -> None:
        self._scheduled = False
        slots = self.slots if self.busy() else math.inf
        while self._in_flight < slots and self._waiting:
            # One call per idle instance (at least one call), in equal parts.
            calls = max(1, min(slots, self.instances) - self._in_flight)
            rows = sum(len(waiting.rows) for waiting in self._waiting)
            limit = min(self.batch_size, math.ceil(rows / calls))
            batch: list[_Waiting] = []
            size = 0
            while self._waiting and (not batch or size + len(self._waiting[0].rows) <= limit):
                waiting = self._waiting.popleft()
                if not waiting.result.done():
                    batch.append(waiting)
                    size += len(waiting.rows)
            if batch:
                self._in_flight += 1
                task = asyncio.create_task(self._run(batch))
                self._running[task] = batch
                task.add_done_callback(lambda done: self._running.pop(done, None))

    def _drop_abandoned(self) -> None:
        """Cancel the Triton calls whose callers have all gone (deadline passed, client disconnected)."""
        for task, batch in list(self._running.items()):
            if all(waiting.result.cancelled() for waiting in batch):
                task.cancel()

    async def _run(self, batch: list[_Waiting]) -> None:
        ids = dict.fromkeys(waiting.request_id for waiting in batch if waiting.request_id != NO_REQUEST)
        REQUEST_ID.set(",".join(ids)[:MAX_BATCH_IDS] or NO_REQUEST)  # this task's own context
        rows = [row for waiting in batch for row in waiting.rows]
        BATCH_SIZE.labels(self.model).observe(len(rows))
        started = time.perf_counter()  # stage timings
        for waiting in batch:
            waiting.left = started
        try:
            output = await self.call(rows)
        except Exception as exc:
            for waiting in batch:
                if not waiting.result.done():
                    waiting.result.set_exception(exc)
        else:
            start = 0
            for waiting in batch:
                if not waiting.result.done():
                    waiting.result.set_result(output[start:start + len(waiting.rows)])
                start += len(waiting.rows)
        finally:
            self._in_flight -= 1
            self._dispatch()


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
        self.batcher.batch_size = self.batch_size
        self.instances = instance_count(triton_config)

    async def refresh(self) -> bool:
        ready = await super().refresh()
        # Each Triton call runs on one instance of one endpoint: the batcher spreads rows over them all.
        self.batcher.instances = self.instances * max(1, len(self.endpoints.ready()))
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
        result = await self.triton.infer(self.endpoints, self.triton_name, tensors, [self.output_name],
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
