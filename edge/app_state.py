"""The edge's typed state: what the lifespan (edge/app.py) opens once, before the first request, and every
route reads (`edge_state`): the settings, the service clients, the stored Responses, the interactive
sessions, the image limits, the keys (edge/keys/), the model queues (edge/queue.py), and the per-request
limits that the request models' validators read (`RequestLimits`, pydantic's validation context, which
the lean routes give them: edge/lean.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from pydantic import ValidationInfo
from starlette.requests import HTTPConnection

from edge.auth import load_api_keys
from edge.clients import ServiceClients
from edge.images import ImageLimits
from edge.keys.ring import KeyRing
from edge.queue import ModelGates
from edge.state import Limits, Space, StateStore
from tritongate.settings import Settings

CANCEL_TTL_S = 60.0  # an interactive `cancel` waits this long for the turn it stops to notice it


@dataclass(frozen=True)
class Sessions:
    """The interactive sessions and the cancel requests for their turns in flight, in the shared state store."""

    conversations: Space
    cancels: Space


@dataclass(frozen=True)
class RequestLimits:
    """The edge's per-request limits (TRITONGATE_MAX_EMBEDDING_INPUTS, TRITONGATE_MAX_RERANK_DOCUMENTS), which
    the request models' validators read from pydantic's validation context (`limits_of`)."""

    max_embedding_inputs: int
    max_rerank_documents: int


UNLIMITED = RequestLimits(sys.maxsize, sys.maxsize)


@dataclass(frozen=True)
class EdgeState:
    settings: Settings
    clients: ServiceClients
    responses: Space  # the stored Responses
    sessions: Sessions
    images: ImageLimits
    limits: RequestLimits
    keys: KeyRing
    gates: ModelGates

    @classmethod
    def open(cls, settings: Settings, store: StateStore) -> EdgeState:
        """The state of an edge with these settings, its state kept in `store` (the clients are opened here;
        nothing is connected yet)."""
        sessions = Limits(settings.interactive_max_sessions, settings.interactive_session_ttl_s)
        return cls(settings=settings, clients=ServiceClients.open(settings),
                   responses=store.space("responses", Limits(settings.responses_store_max,
                                                             settings.responses_store_ttl_s)),
                   sessions=Sessions(store.space("sessions", sessions),
                                     store.space("cancels", Limits(sessions.max_entries, CANCEL_TTL_S))),
                   images=ImageLimits.of(settings),
                   limits=RequestLimits(settings.max_embedding_inputs, settings.max_rerank_documents),
                   keys=KeyRing(store, load_api_keys(settings)),
                   gates=ModelGates(settings.queue_slots, settings.queue_max_waiting, settings.queue_timeout_s,
                                    settings.retry_after_s))


def edge_state(request: HTTPConnection) -> EdgeState:
    """The edge's state, as the lifespan set it."""
    state: EdgeState = request.app.state.edge
    return state


def validation_context(request: HTTPConnection) -> RequestLimits | None:
    """What the request models' validators are given (pydantic's validation context): the edge's per-request
    limits; none in an app without the edge's state."""
    state: EdgeState | None = getattr(request.app.state, "edge", None)
    return None if state is None else state.limits


def limits_of(info: ValidationInfo) -> RequestLimits:
    """The per-request limits in a validator's context; validated without them, none."""
    return info.context if isinstance(info.context, RequestLimits) else UNLIMITED
