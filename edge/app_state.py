"""The edge's typed state: what the lifespan (edge/app.py) opens once, before the first request, and every
route reads (`edge_state`): the settings, the service clients, the stored Responses, the interactive
sessions, the image limits and the per-request limits that the request models' validators read."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import HTTPConnection

from edge.clients import ServiceClients
from edge.images import ImageLimits
from edge.state import Limits, Space, StateStore
from tritongate.settings import Settings

CANCEL_TTL_S = 60.0  # an interactive `cancel` waits this long for the turn it stops to notice it


@dataclass(frozen=True)
class Sessions:
    """The interactive sessions and the cancel requests for their turns in flight, in the shared state store."""

    conversations: Space
    cancels: Space


@dataclass(frozen=True)
class EdgeState:
    settings: Settings
    clients: ServiceClients
    responses: Space  # the stored Responses
    sessions: Sessions
    images: ImageLimits

    @classmethod
    def open(cls, settings: Settings, store: StateStore) -> EdgeState:
        """The state of an edge with these settings, its state kept in `store` (the clients are opened here;
        nothing is connected yet)."""
        sessions = Limits(settings.interactive_max_sessions, settings.interactive_session_ttl_s)
        return cls(settings, ServiceClients.open(settings),
                   store.space("responses", Limits(settings.responses_store_max, settings.responses_store_ttl_s)),
                   Sessions(store.space("sessions", sessions),
                            store.space("cancels", Limits(sessions.max_entries, CANCEL_TTL_S))),
                   ImageLimits.of(settings))


def edge_state(request: HTTPConnection) -> EdgeState:
    """The edge's state, as the lifespan set it."""
    state: EdgeState = request.app.state.edge
    return state
