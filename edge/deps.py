"""Typed FastAPI dependencies: what a router may ask for. The lifespan (edge/app.py) opens the service
clients; this is the one place that reads them (and the settings) off the app."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from edge.clients import EmbedClient, LlmClient, ModelDirectory, RerankClient, ServiceClients
from edge.endpoints.interactive import Session
from edge.endpoints.responses import Stored
from edge.store import BoundedStore
from tritongate.settings import Settings


def _clients(request: Request) -> ServiceClients:
    clients: ServiceClients = request.app.state.clients
    return clients


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def _all(request: Request) -> ServiceClients:
    return _clients(request)


async def _directory(request: Request) -> ModelDirectory:
    return _clients(request).directory


async def _llm(request: Request) -> LlmClient:
    return _clients(request).llm


async def _embed(request: Request) -> EmbedClient:
    return _clients(request).embed


async def _rerank(request: Request) -> RerankClient:
    return _clients(request).rerank


async def _response_store(request: Request) -> BoundedStore[Stored]:
    store: BoundedStore[Stored] = request.app.state.responses
    return store


async def _sessions(request: Request) -> BoundedStore[Session]:
    sessions: BoundedStore[Session] = request.app.state.sessions
    return sessions


SettingsDep = Annotated[Settings, Depends(_settings)]
ClientsDep = Annotated[ServiceClients, Depends(_all)]
DirectoryDep = Annotated[ModelDirectory, Depends(_directory)]
LlmDep = Annotated[LlmClient, Depends(_llm)]
EmbedDep = Annotated[EmbedClient, Depends(_embed)]
RerankDep = Annotated[RerankClient, Depends(_rerank)]
ResponseStoreDep = Annotated[BoundedStore[Stored], Depends(_response_store)]
SessionsDep = Annotated[BoundedStore[Session], Depends(_sessions)]
