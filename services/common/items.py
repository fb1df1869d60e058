"""Requests inside a shared RPC: the items of a batch RPC (EmbedBatch, RerankBatch) and the generations of
a GenerateMany stream. The edge sends requests together so that the cost of an RPC is paid once for
several, and each is served as the call it stands for (Embed, Rerank, Generate) would be, by one rule
(`ItemCall`):

- Its request id is the one its `ItemContext` carries, read as a call's metadata is read: bound for its
  log lines and Triton calls (the items a batch RPC serves together run under their ids joined), and its
  failure is logged under it.
- It takes an admission slot of its own, refused with RESOURCE_EXHAUSTED beyond `max_in_flight`, and gives
  it back when it ends. On a stream, which outlives the start of a drain, it is refused with UNAVAILABLE
  while the service drains, as a new call would be.
- Its deadline is its `ItemContext`'s `timeout_s`: passed on to Triton, and kept here (`deadline`): past
  it, the request fails with DEADLINE_EXCEEDED. The items a batch RPC serves together run under the
  longest of theirs.
- It counts in the RPC metrics as the call it stands for: grpc_server_started_total,
  grpc_server_handled_total (its own code), grpc_server_in_flight and grpc_server_handling_seconds under
  that call's method (`grpc_method="Embed"`, ...), so that a method's counts are its requests however they
  travelled; and in tritongate_batched_requests_total under the shared RPC's method, with the same code.
  The shared RPC itself counts once, as itself.
- With tracing on, it has a span of its own, named as that call's and a child of the caller's span that
  its `ItemContext` carries (`traceparent`).
- Its failure is its `ItemError`: the status the call would have ended with (`item_error`).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc

from services.common.admission import Admission
from services.common.errors import ServiceError, item_error
from services.common.metrics import BATCHED, count_handled, count_started
from tritongate import tracing
from tritongate.common.v1 import common_pb2
from tritongate.logs import NO_REQUEST, REQUEST_ID, sane_request_id
from tritongate.wire import OVERLOADED

_CODES = {code.value[0]: code for code in grpc.StatusCode}  # a status code's number → the code


@asynccontextmanager
async def deadline(timeout: float | None) -> AsyncIterator[None]:
    """The block, cut short at `timeout` seconds (None: no deadline) with DEADLINE_EXCEEDED."""
    try:
        async with asyncio.timeout(timeout):
            yield
    except TimeoutError:
        raise ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None


@dataclass(frozen=True, slots=True)
class ItemCalls:
    """The requests of one shared RPC: the call each stands for, the shared RPC's method, the service's
    admission, and, for a stream, the event set while the service drains. (A batch RPC's items arrive with
    it: gRPC refuses the RPC itself once the service drains, and serves one it has taken.)"""

    stands_for: tuple[str, str, str]  # (service, method, type), as MetricsInterceptor labels that call
    shared: str  # the method of the RPC they share: EmbedBatch, RerankBatch, GenerateMany
    admission: Admission | None = None
    draining: asyncio.Event | None = None

    def start(self, context: common_pb2.ItemContext) -> ItemCall:
        return ItemCall(self, context)


class ItemCall:
    """One request inside a shared RPC, from its arrival to its end, served as the call it stands for."""

    __slots__ = ("admitted", "calls", "ended", "request_id", "span", "start", "timeout")

    def __init__(self, calls: ItemCalls, context: common_pb2.ItemContext) -> None:
        self.calls = calls
        self.request_id = sane_request_id(context.request_id) or NO_REQUEST
        self.timeout = context.timeout_s or None
        self.admitted = self.ended = False
        self.start = count_started(calls.stands_for)
        service, method, _ = calls.stands_for
        spans = tracing.ITEM_SPANS
        self.span = spans.start(f"/{service}/{method}", context.traceparent, self.request_id) \
            if spans is not None and context.traceparent else None

    def admit(self) -> None:
        """Take its admission slot (a ServiceError when refused)."""
        calls = self.calls
        if calls.draining is not None and calls.draining.is_set():
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, "The service is shutting down.")
        if calls.admission is not None:
            if not calls.admission.try_enter():
                raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, calls.admission.message(),
                                   error_code=OVERLOADED)
            self.admitted = True

    def end(self, failure: BaseException | None = None) -> common_pb2.ItemError | None:
        """Give back its slot, count it with the status it ended with, end its span; its failure as its
        ItemError (logged under its own id). Once: later calls do nothing."""
        if self.ended:
            return None
        self.ended = True
        if self.admitted and self.calls.admission is not None:
            self.calls.admission.leave()
        error = None
        if failure is None:
            code = grpc.StatusCode.OK
        elif isinstance(failure, asyncio.CancelledError):  # not a failure of the service: not logged
            code = grpc.StatusCode.CANCELLED
            error = common_pb2.ItemError(code=code.value[0], message="Cancelled")
        else:
            own = contextvars.copy_context()  # whatever the current task has bound
            own.run(REQUEST_ID.set, self.request_id)
            error = own.run(item_error, failure)
            code = _CODES.get(error.code, grpc.StatusCode.UNKNOWN)
        count_handled(self.calls.stands_for, self.start, code)
        BATCHED.labels(self.calls.shared, code.name).inc()
        if self.span is not None and tracing.ITEM_SPANS is not None:
            tracing.ITEM_SPANS.end(self.span, code)
        return error

    async def serve(self, work: Callable[[float | None], Awaitable[None]]) -> common_pb2.ItemError | None:
        """Serve the request alone, in the current task (its own): its id bound, admitted, `work(timeout)`
        under its deadline, then ended; its ItemError if it failed."""
        REQUEST_ID.set(self.request_id)  # (not bind_request_id: that tags the span in this task, the stream's)
        try:
            self.admit()
            async with deadline(self.timeout):
                await work(self.timeout)
        except Exception as exc:
            return self.end(exc)
        except BaseException as exc:  # cancelled: it ends with no further word
            self.end(exc)
            raise
        return self.end()
