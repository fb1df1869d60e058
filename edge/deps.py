"""Typed FastAPI dependencies: what a router may ask for. The lifespan (edge/app.py) opens the service
clients; this is the one place that reads them (and the settings) off the app. Lean endpoints
(edge/lean.py), which FastAPI's dependency injection does not serve, call `clients` and `settings`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from edge.clients import LlmClient, ModelDirectory, ServiceClients
from edge.endpoints.interactive import Sessions
from edge.state import Space
from tritongate.settings import Settings


def clients(request: Request) -> ServiceClients:
    found: ServiceClients = request.app.state.clients
    return found


def settings(request: Request) -> Settings:
    found: Settings = request.app.state.settings
    return found


async def _settings(request: Request) -> Settings:
    return settings(request)


async def _all(request: Request) -> ServiceClients:
    return clients(request)


async def _directory(request: Request) -> ModelDirectory:
    return clients(request).directory


async def _llm(request: Request) -> LlmClient:
    return clients(request).llm


async def _response_store(request: Request) -> Space:
    store: Space = request.app.state.responses
    return store


async def _sessions(request: Request) -> Sessions:
    sessions: Sessions = request.app.state.sessions
    return sessions


SettingsDep = Annotated[Settings, Depends(_settings)]
ClientsDep = Annotated[ServiceClients, Depends(_all)]
DirectoryDep = Annotated[ModelDirectory, Depends(_directory)]
LlmDep = Annotated[LlmClient, Depends(_llm)]
ResponseStoreDep = Annotated[Space, Depends(_response_store)]
SessionsDep = Annotated[Sessions, Depends(_sessions)]
