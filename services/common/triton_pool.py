"""A model's pool of Triton endpoints: those it is served from, and which of them takes its next call.

A model's Triton address names one endpoint or several (tritongate/triton_address.py, `TritonAddress`): fixed
`host:port`s, and DNS names (`dns:///host:port`) whose addresses are looked up again every few seconds,
so that Triton pods behind a Kubernetes headless Service are found as they come and go. Each endpoint is
in or out of the model's rotation:
- out when a call finds it unavailable (Triton unreachable, the model not loaded or its instance
  crashed: `triton_error`'s UNAVAILABLE), or when its readiness check says no;
- back in when a readiness check finds the model ready there again.
A ready endpoint stays in through UNANSWERED_CHECKS - 1 readiness checks in a row that Triton does not
answer in time (a busy Triton answers late); the next one takes it out, as a probe's failure threshold
would. The model is ready while one endpoint is.

Calls go to the endpoint in rotation with the fewest calls of this model in flight (a stream counts
until it ends), so that a slow replica gets fewer; ties go to the one picked longest ago. A generation
with a `Route` goes where its prompt's prefix is likely cached (services/common/prefix_routing.py), unless
that endpoint is overloaded; an endpoint that leaves the rotation loses its record there.
Nothing here talks to Triton: the readiness check is given (services/common/triton.py makes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from services.common.metrics import (
    ENDPOINT_CALLS,
    ENDPOINT_EJECTIONS,
    ENDPOINT_IN_FLIGHT,
    ENDPOINT_READY,
    ROUTING_CACHED_TOKENS,
    ROUTING_DECISIONS,
    ROUTING_HIT_TOKENS,
    ROUTING_IMBALANCE,
    ROUTING_PROMPT_TOKENS,
)
from services.common.prefix_routing import BLOCK_TOKENS, PrefixRecord, Route, RoutingRule, choose
from tritongate.triton_address import TritonAddress

log = logging.getLogger(__name__)

UNANSWERED_CHECKS = 3  # readiness checks in a row without an answer that take a ready endpoint out
DEFAULT_RESOLVE_EVERY_S = 5.0
FOUND_UNAVAILABLE = "an inference found it unavailable"


class ReadinessUnknown(Exception):
    """A readiness check that Triton did not answer in time: Triton may be busy or stuck."""


# (host, port) → the addresses ("host:port") it resolves to now.
Resolver = Callable[[str, int], Awaitable[list[str]]]
# An endpoint's address → None when the model is ready there, else why not; ReadinessUnknown when Triton
# does not answer in time.
ReadinessCheck = Callable[[str], Awaitable[str | None]]


async def resolve(host: str, port: int) -> list[str]:
    """Every address `host` has now (the event loop's getaddrinfo, as the system resolves names)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({TritonAddress(str(info[4][0]), port).host_port for info in infos})


@dataclass(eq=False)
class Endpoint:
    """One Triton gRPC endpoint (`host:port`) of a model."""

    address: str
    ready: bool = False  # in the rotation
    why_not: str = "not checked yet"
    in_flight: int = 0
    last_pick: int = -1  # when it was last picked (a count of picks): ties go to the longest ago
    unanswered: int = 0  # readiness checks in a row that Triton did not answer in time
    found_unavailable: bool = False  # a call found it unavailable since its last readiness check
    gone: bool = False  # its DNS name no longer resolves to it


class TritonPool:
    """The Triton endpoints of one model (`name`: the model id, in logs and metrics), from its Triton addresses."""

    def __init__(self, addresses: Sequence[TritonAddress], name: str,
                 resolve_every_s: float = DEFAULT_RESOLVE_EVERY_S, resolver: Resolver = resolve) -> None:
        self.addresses = list(addresses)
        self.name = name
        self.resolve_every_s = resolve_every_s
        self.resolver = resolver
        self._resolved: dict[TritonAddress, list[str]] = {}  # each DNS name's last answer
        self._resolve_errors: dict[TritonAddress, str] = {}  # each DNS name's last failure, while it fails
        self._next_resolve = 0.0
        self._picks = itertools.count()
        self.endpoints: dict[str, Endpoint] = {}
        self.record: PrefixRecord | None = None  # made at the first routed pick, of the rule's size
        self._update({a.host_port for a in self.addresses if not a.dns})

    def __str__(self) -> str:
        """The addresses as configured."""
        return ",".join(str(address) for address in self.addresses)

    def __iter__(self) -> Iterator[Endpoint]:
        return iter(list(self.endpoints.values()))

    def ready(self) -> list[Endpoint]:
        return [endpoint for endpoint in self.endpoints.values() if endpoint.ready]

    def pick(self, avoid: Endpoint | None = None, route: Route | None = None, rule: RoutingRule | None = None
             ) -> Endpoint | None:
        """The ready endpoint (other than `avoid`) with the fewest calls in flight, the one picked longest
        ago among equals; with a `route` (and a prefix-aware `rule`), the one `choose` says, its prompt then
        recorded there. None when there is none."""
        candidates = [endpoint for endpoint in self.endpoints.values() if endpoint.ready and endpoint is not avoid]
        if not candidates:
            return None
        if route is None or rule is None or not rule.prefix_aware or len(candidates) == 1:  # nothing to weigh
            chosen = min(candidates, key=lambda endpoint: (endpoint.in_flight, endpoint.last_pick))
        else:
            chosen = self._route(candidates, route, rule)
        chosen.last_pick = next(self._picks)
        if route is not None:
            route.endpoint = chosen.address  # where its usage is counted
        return chosen

    def _route(self, candidates: list[Endpoint], route: Route, rule: RoutingRule) -> Endpoint:
        if self.record is None:
            self.record = PrefixRecord(rule.record_tokens // BLOCK_TOKENS)
        choice = choose(candidates, route, self.record, rule)
        chosen = self.endpoints[choice.endpoint.address]
        self.record.add(route.blocks, chosen.address)
        route.hit_tokens = choice.hit_tokens
        ROUTING_DECISIONS.labels(self.name, choice.reason).inc()
        ROUTING_HIT_TOKENS.labels(self.name, chosen.address).inc(choice.hit_tokens)
        loads = [endpoint.in_flight for endpoint in candidates]
        ROUTING_IMBALANCE.labels(self.name).set(max(loads) - min(loads))
        if choice.passed_over:
            log.debug("model %s: %s overloaded; %s takes the call", self.name, ", ".join(choice.passed_over),
                      chosen.address)
        return chosen

    def count_usage(self, route: Route, prompt_tokens: int, cached_tokens: int) -> None:
        """The prompt tokens a routed generation sent to its endpoint, and those the backend said it had cached."""
        endpoint = self.endpoints.get(route.endpoint)
        if endpoint is None or endpoint.gone:
            return
        ROUTING_PROMPT_TOKENS.labels(self.name, endpoint.address).inc(prompt_tokens)
        ROUTING_CACHED_TOKENS.labels(self.name, endpoint.address).inc(cached_tokens)

    @contextmanager
    def calling(self, endpoint: Endpoint) -> Iterator[None]:
        """Counts a call on `endpoint` in flight while it lasts."""
        endpoint.in_flight += 1
        if not endpoint.gone:
            ENDPOINT_CALLS.labels(self.name, endpoint.address).inc()
            ENDPOINT_IN_FLIGHT.labels(self.name, endpoint.address).set(endpoint.in_flight)
        try:
            yield
        finally:
            endpoint.in_flight -= 1
            if not endpoint.gone:
                ENDPOINT_IN_FLIGHT.labels(self.name, endpoint.address).set(endpoint.in_flight)

    def found_unavailable(self, endpoint: Endpoint, why: str) -> None:
        """A call found `endpoint` unavailable: out of the rotation now; its next readiness check reports it
        not ready without asking (Triton may call a model ready while its crashed instance restarts), the
        one after asks Triton."""
        endpoint.found_unavailable = True
        self._report(endpoint, *self._set(endpoint, FOUND_UNAVAILABLE), f"{FOUND_UNAVAILABLE}: {why}")

    async def refresh(self, check: ReadinessCheck) -> str | None:
        """Look up the DNS names when due, check every endpoint's readiness; None when the model is ready on
        one endpoint at least, else why not."""
        await self._resolve()
        endpoints = list(self)
        results = await asyncio.gather(*(self._check(endpoint, check) for endpoint in endpoints),
                                       return_exceptions=True)
        changes = []
        for endpoint, result in zip(endpoints, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                result = f"its readiness check failed: {result}"
            if not endpoint.gone and not endpoint.found_unavailable:  # a call's verdict since is newer
                changes.append((endpoint, *self._set(endpoint, result)))
        for change in changes:  # once all are known, so that the counts in the lines are right
            self._report(*change)
        return self.why_not_ready()

    def why_not_ready(self) -> str | None:
        """None when one endpoint is ready, else why none is."""
        if any(endpoint.ready for endpoint in self.endpoints.values()):
            return None
        if not self.endpoints:
            problems = "; ".join(f"{address}: {error}" for address, error in self._resolve_errors.items())
            return f"{self} resolves to no address{f' ({problems})' if problems else ''}"
        if len(self.endpoints) == 1:
            return next(iter(self.endpoints.values())).why_not
        return "no endpoint is ready (" + "; ".join(f"{e.address}: {e.why_not}" for e in self) + ")"

    async def _check(self, endpoint: Endpoint, check: ReadinessCheck) -> str | None:
        """Why `endpoint` is not ready (None: it is). An unanswered check leaves a ready endpoint in until
        UNANSWERED_CHECKS in a row."""
        if endpoint.found_unavailable:
            endpoint.found_unavailable = False
            return FOUND_UNAVAILABLE
        try:
            why_not = await check(endpoint.address)
        except ReadinessUnknown as exc:
            endpoint.unanswered += 1
            why_not = f"Triton gave its readiness check {exc} ({endpoint.unanswered} in a row)"
            if endpoint.ready and endpoint.unanswered < UNANSWERED_CHECKS:
                log.warning("model %s: Triton endpoint %s: %s; it stays in", self.name, endpoint.address, why_not)
                return None
            return why_not
        endpoint.unanswered = 0
        return why_not

    def _set(self, endpoint: Endpoint, why_not: str | None) -> tuple[bool, bool]:
        """Record a readiness (None: ready); returns whether the endpoint was ready, and checked, before."""
        before = endpoint.ready, endpoint.why_not != "not checked yet"
        endpoint.ready, endpoint.why_not = why_not is None, why_not or ""
        if before[0] and not endpoint.ready and self.record is not None:
            self.record.forget(endpoint.address)  # a Triton that comes back may have lost its cache
        ENDPOINT_READY.labels(self.name, endpoint.address).set(1 if endpoint.ready else 0)
        return before

    def _report(self, endpoint: Endpoint, was_ready: bool, checked: bool, detail: str = "") -> None:
        """Log (`detail`: why, at more length) and count a change of readiness."""
        count = f"{len(self.ready())} of {len(self.endpoints)} ready"
        if endpoint.ready and not was_ready:
            log.info("model %s: Triton endpoint %s is ready: in the rotation (%s)", self.name, endpoint.address, count)
        elif was_ready and not endpoint.ready:
            ENDPOINT_EJECTIONS.labels(self.name, endpoint.address).inc()
            log.warning("model %s: Triton endpoint %s taken out of the rotation: %s (%s)", self.name,
                        endpoint.address, detail or endpoint.why_not, count)
        elif not checked and not endpoint.ready:
            log.warning("model %s: Triton endpoint %s is not ready: %s (%s)", self.name, endpoint.address,
                        endpoint.why_not, count)

    async def _resolve(self) -> None:
        """Each DNS name's addresses, at most every `resolve_every_s`; a name that fails to resolve keeps its
        last addresses (their readiness checks tell whether they still serve)."""
        names = [address for address in self.addresses if address.dns]
        if not names or time.monotonic() < self._next_resolve:
            return
        self._next_resolve = time.monotonic() + self.resolve_every_s
        answers = await asyncio.gather(*(self.resolver(a.host, a.port) for a in names), return_exceptions=True)
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                error = str(answer) or type(answer).__name__
                if self._resolve_errors.get(name) != error:
                    log.warning("model %s: cannot resolve %s: %s; keeping its addresses %s", self.name, name,
                                error, self._resolved.get(name, []))
                self._resolve_errors[name] = error
                continue
            self._resolve_errors.pop(name, None)
            if answer != self._resolved.get(name):
                log.info("model %s: %s resolves to %s (was %s)", self.name, name, answer, self._resolved.get(name, []))
            self._resolved[name] = answer
        wanted = {a.host_port for a in self.addresses if not a.dns}
        self._update(wanted.union(*self._resolved.values()))

    def _update(self, wanted: set[str]) -> None:
        """The endpoints become `wanted`: new ones are out until checked, gone ones leave (calls in flight on
        them end as they will)."""
        for address in sorted(wanted - self.endpoints.keys()):
            self.endpoints[address] = Endpoint(address)
            ENDPOINT_READY.labels(self.name, address).set(0)
        for address in sorted(self.endpoints.keys() - wanted):
            endpoint = self.endpoints.pop(address)
            endpoint.gone, endpoint.ready = True, False
            if self.record is not None:
                self.record.forget(address)
            log.info("model %s: Triton endpoint %s left (%d in flight there)", self.name, address, endpoint.in_flight)
            for metric in (ENDPOINT_CALLS, ENDPOINT_EJECTIONS, ENDPOINT_IN_FLIGHT, ENDPOINT_READY, ROUTING_HIT_TOKENS,
                           ROUTING_PROMPT_TOKENS, ROUTING_CACHED_TOKENS):
                with contextlib.suppress(KeyError):  # never labelled
                    metric.remove(self.name, address)
