"""The batch RPCs (EmbedBatch, RerankBatch): several requests in one call, each answered as its own unary
call would be. The edge sends them when requests for one model arrive together or while another call is
in flight.

The items of one model are served together (`EncoderModel.serve_many`: one tokenizer call, their rows
in one submission to the batcher), under the longest of their deadlines, with their request ids joined
for the log lines and the Triton request id (`tritongate.batching.joined_id`). Each item takes its own
admission slot, so `max_in_flight` counts requests however they travel; an item that fails (a bad input,
no slot) fails alone, with the status a unary call would have had, logged under its own id.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import grpc

from services.common.admission import Admission
from services.common.encoder import EncoderModel
from services.common.errors import item_error
from services.common.metrics import BATCHED
from services.common.server import ModelSet
from tritongate.batching import joined_id
from tritongate.common.v1 import common_pb2
from tritongate.logs import NO_REQUEST, REQUEST_ID, bind_request_id
from tritongate.wire import OVERLOADED

_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}  # a status code's number → its name

Response = TypeVar("Response")
M = TypeVar("M", bound=EncoderModel)


class Item(Protocol):
    """An item of a batch request (EmbedBatchItem, RerankBatchItem)."""

    @property
    def request(self) -> Any: ...

    @property
    def context(self) -> common_pb2.ItemContext: ...


async def serve_batch(models: ModelSet[M], request: Any, admission: Admission | None, method: str,
                      result: Callable[..., Any], response: Callable[..., Response]) -> Response:
    """The answer to a batch RPC (`request.items`): the items of each model served together, the models
    concurrently; each item's answer or error as a `result(response=...)` or `result(error=...)` in
    `response(results=[...])`."""
    items: Sequence[Item] = request.items
    outcomes: list[Any] = [None] * len(items)
    by_model: dict[str, list[int]] = {}
    admitted = 0
    for position, item in enumerate(items):
        if admission is not None and not admission.try_enter():
            outcomes[position] = common_pb2.ItemError(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                                                      message=admission.message(), error_code=OVERLOADED)
        else:
            admitted += 1
            by_model.setdefault(item.request.model, []).append(position)

    async def serve(name: str, positions: list[int]) -> None:
        together = [items[i] for i in positions]
        bind_request_id(joined_id(item.context.request_id for item in together))  # this task's own context
        timeouts = [item.context.timeout_s for item in together]
        try:
            answers = await models.get(name).serve_many([item.request for item in together],
                                                        max(timeouts) if all(timeouts) else None)
        except Exception as exc:
            answers = [exc] * len(together)
        for position, answer in zip(positions, answers, strict=True):
            if isinstance(answer, BaseException):  # logged, if at all, under the item's own id
                own = contextvars.copy_context()
                own.run(REQUEST_ID.set, items[position].context.request_id or NO_REQUEST)
                answer = own.run(item_error, answer)
            outcomes[position] = answer

    try:
        await asyncio.gather(*(serve(name, positions) for name, positions in by_model.items()))
    finally:
        if admission is not None:
            for _ in range(admitted):
                admission.leave()
    results = []
    for outcome in outcomes:
        failed = isinstance(outcome, common_pb2.ItemError)
        BATCHED.labels(method, _CODE_NAMES.get(outcome.code, "UNKNOWN") if failed else "OK").inc()
        results.append(result(error=outcome) if failed else result(response=outcome))
    return response(results=results)
