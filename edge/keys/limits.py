"""One authenticated request on its way through the edge: its priority (the `x-tritongate-priority`
header, else its key's default; the body's `priority` wins later, edge/keys/caller.py), its key's limits
(a 429 with OpenAI's x-ratelimit-* headers and Retry-After when over one, those headers on every answer
otherwise), and, once it is answered, its usage added to its key's account and to the metrics."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edge.errors import OpenAIError, as_openai_error
from edge.keys.caller import CALLER, Caller
from edge.keys.policy import MAX_PRIORITY, MIN_PRIORITY, KeyPolicy
from edge.keys.ring import Levels, Refusal
from edge.queue import BATCH
from edge.state import StoreUnavailable
from edge.telemetry import current, record_key_usage

if TYPE_CHECKING:
    from edge.app_state import EdgeState

log = logging.getLogger(__name__)

EXTENSION = "tritongate"  # scope["extensions"]["tritongate"]: an in-process request's key name and priority
PRIORITY_HEADER = b"x-tritongate-priority"


def duration(seconds: float) -> str:
    """OpenAI's spelling of a reset time: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest}s"


def rate_headers(levels: Levels) -> list[tuple[bytes, bytes]]:
    headers: list[tuple[str, object]] = []
    if levels.rpm:
        headers += [("x-ratelimit-limit-requests", levels.rpm),
                    ("x-ratelimit-remaining-requests", levels.requests_left),
                    ("x-ratelimit-reset-requests", duration(levels.requests_reset_s))]
    if levels.tpm:
        headers += [("x-ratelimit-limit-tokens", levels.tpm), ("x-ratelimit-remaining-tokens", levels.tokens_left),
                    ("x-ratelimit-reset-tokens", duration(levels.tokens_reset_s))]
    return [(name.encode(), str(value).encode()) for name, value in headers]


def refused(refusal: Refusal, policy: KeyPolicy) -> OpenAIError:
    wait = refusal.retry_after_s
    if refusal.kind == "budget":
        when = "" if math.isinf(wait) else f" It resets in {duration(wait)}."
        return OpenAIError(429, f"The key {policy.name!r} has used its budget of {refusal.limit} tokens.{when}",
                           code="insufficient_quota", type_="insufficient_quota",
                           headers=None if math.isinf(wait) else {"Retry-After": str(math.ceil(wait))})
    unit = "requests per min (RPM)" if refusal.kind == "requests" else "tokens per min (TPM)"
    headers = {"Retry-After": str(max(1, math.ceil(wait))),
               f"x-ratelimit-limit-{refusal.kind}": str(refusal.limit),
               f"x-ratelimit-remaining-{refusal.kind}": "0",
               f"x-ratelimit-reset-{refusal.kind}": duration(wait)}
    return OpenAIError(429, f"Rate limit reached for key {policy.name!r} on {unit}: Limit {refusal.limit}. "
                       f"Please try again in {duration(wait)}.", code="rate_limit_exceeded", type_=refusal.kind,
                       headers=headers)


def request_priority(scope: Scope, policy: KeyPolicy | None) -> int:
    """The in-process batch class, else the header's priority, else the key's default, else 0."""
    in_process = scope.get("extensions", {}).get(EXTENSION)
    if in_process is not None and in_process.get("priority") == "batch":
        return BATCH
    for name, value in scope["headers"]:
        if name == PRIORITY_HEADER:
            text = value.decode("latin-1").strip()
            if not text.lstrip("-").isdigit() or not MIN_PRIORITY <= int(text) <= MAX_PRIORITY:
                raise OpenAIError(400, f"The x-tritongate-priority header must be an integer between "
                                  f"{MIN_PRIORITY} and {MAX_PRIORITY} (lower is served earlier).", "priority")
            return int(text)
    return policy.priority if policy is not None else 0


async def serve(app: ASGIApp, scope: Scope, receive: Receive, send: Send, state: EdgeState,
                policy: KeyPolicy | None) -> None:
    """Serve an authenticated HTTP request: priority, limits, the caller, then its usage."""
    headers: list[tuple[bytes, bytes]] = []
    try:
        priority = request_priority(scope, policy)
        if policy is not None and policy.limited:
            outcome = await state.keys.admit(policy)
            if isinstance(outcome, Refusal):
                raise refused(outcome, policy)
            headers = rate_headers(outcome)
    except (OpenAIError, StoreUnavailable) as exc:
        await as_openai_error(exc).response(scope["path"])(scope, receive, send)
        return

    async def with_headers(message: Message) -> None:
        if message["type"] == "http.response.start" and headers:
            message = {**message, "headers": [*message.get("headers", ()), *headers]}
        await send(message)

    caller = Caller(policy, priority, state.gates)
    CALLER.set(caller)  # each request runs in its own task: no reset
    try:
        await app(scope, receive, with_headers)
    finally:
        caller.leave()
        if policy is not None:
            await _record(state, policy)


async def _record(state: EdgeState, policy: KeyPolicy) -> None:
    exchange = current()
    if not exchange.model:  # no model reached: nothing served to count
        return
    prompt, completion = exchange.prompt_tokens or 0, exchange.completion_tokens or 0
    cached = exchange.cached_tokens or 0
    record_key_usage(policy.name, exchange.model, prompt, completion, cached)
    if policy.digest == "":  # a configured key (`default`): unlimited, no account to keep in the store
        return
    try:
        await state.keys.record(policy, exchange.model, prompt, completion, cached)
    except StoreUnavailable as exc:  # answered already: the account misses this one
        log.warning("usage of key %r not counted: %s", policy.name, exc)
