"""The batch RPCs (EmbedBatch, RerankBatch): several requests in one call, each answered as its own unary
call would be. The edge sends them when requests for one model arrive together or while another call is
in flight.

Each item is a request inside a shared RPC, served by their one rule (services/common/items.py): its own
request id, admission slot, deadline, metrics (as the unary call it stands for), span and error. An item
that fails (a bad input, no slot) fails alone, with the status a unary call would have had, logged under
its own id. The items of one model are served together (`EncoderModel.serve_many`: for embeddings one
tokenizer call and their rows in one submission to the batcher; reranks concurrently, their rows merged
by the batcher), under the longest of their deadlines, with their request
ids joined for the log lines and the Triton request id (`tritongate.batching.joined_id`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from services.common.encoder import EncoderModel
from services.common.errors import ServiceError
from services.common.items import ItemCalls, deadline
from services.common.server import ModelSet
from tritongate.batching import joined_id
from tritongate.common.v1 import common_pb2
from tritongate.logs import bind_request_id

Response = TypeVar("Response")
M = TypeVar("M", bound=EncoderModel)


class Item(Protocol):
    """An item of a batch request (EmbedBatchItem, RerankBatchItem)."""

    @property
    def request(self) -> Any: ...

    @property
    def context(self) -> common_pb2.ItemContext: ...


async def serve_batch(models: ModelSet[M], request: Any, calls: ItemCalls, result: Callable[..., Any],
                      response: Callable[..., Response]) -> Response:
    """The answer to a batch RPC (`request.items`): the items of each model served together, the models
    concurrently; each item's answer or error as a `result(response=...)` or `result(error=...)` in
    `response(results=[...])`."""
    items: Sequence[Item] = request.items
    served = [calls.start(item.context) for item in items]
    results: list[Any] = [None] * len(items)
    by_model: dict[str, list[int]] = {}
    for position, (item, call) in enumerate(zip(items, served, strict=True)):
        try:
            call.admit()
        except ServiceError as refused:
            results[position] = result(error=call.end(refused))
        else:
            by_model.setdefault(item.request.model, []).append(position)

    async def serve(name: str, positions: list[int]) -> None:
        together = [served[i] for i in positions]
        bind_request_id(joined_id(call.request_id for call in together))  # this task's own context
        timeouts = [call.timeout for call in together if call.timeout is not None]
        longest = max(timeouts) if len(timeouts) == len(together) else None  # None: one of them has no deadline
        try:
            async with deadline(longest):
                answers = await models.get(name).serve_many([items[i].request for i in positions], longest)
        except Exception as exc:
            answers = [exc] * len(together)
        for position, call, answer in zip(positions, together, answers, strict=True):
            if isinstance(answer, BaseException):
                results[position] = result(error=call.end(answer))
            else:
                call.end()
                results[position] = result(response=answer)

    try:
        await asyncio.gather(*(serve(name, positions) for name, positions in by_model.items()))
    finally:
        for call in served:
            if not call.ended:  # the RPC was cancelled
                call.end(asyncio.CancelledError())
    return response(results=results)
