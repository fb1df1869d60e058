"""The edge: OpenAI REST + SSE in front of the llm, embed and rerank gRPC services."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from edge.app_state import EdgeState
from edge.auth import install_auth
from edge.batches.batches import Batches
from edge.batches.runner import Runner
from edge.errors import install_error_handlers
from edge.lean import LeanRoutes
from edge.limits import BodySizeLimit
from edge.routers import (
    batches,
    chat,
    completions,
    embeddings,
    files,
    health,
    interactive,
    messages,
    models,
    playground,
    rerank,
    responses,
    tei,
    tokenize,
)
from edge.state import open_store
from edge.telemetry import install_metrics
from tritongate.settings import Settings, get_settings
from tritongate.tls import client_tls

log = logging.getLogger(__name__)

# FastAPI's own OpenTelemetry layer (newer releases) asks on every request whether a provider is set: the
# edge has its metrics (edge/telemetry.py) and its tracing (TRITONGATE_OTEL, tritongate/tracing.py), so off.
_NO_NATIVE_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    client_tls(settings)  # a CA that cannot be read stops the edge here, not in the lifespan

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = open_store(settings.state_url)
        log.info("state shared through %s", store.name)
        app.state.edge = state = EdgeState.open(settings, store)  # read through `edge_state` (edge/app_state.py)
        app.state.batches = Batches.open(settings, store)  # read through `batches_of` (edge/batches/batches.py)
        runner = Runner(app, app.state.batches, settings)
        serving = asyncio.create_task(runner.serve(), name="batches")
        try:
            yield
        finally:
            serving.cancel()
            await runner.close()
            await state.clients.close()
            await store.close()

    app = FastAPI(
        title="tritongate",
        summary="OpenAI-compatible API for models served by NVIDIA Triton Inference Server",
        version="0.1.0",
        lifespan=lifespan,
        **_NO_NATIVE_TELEMETRY,
    )
    install_error_handlers(app)
    routers = [module.router for module in (models, chat, completions, embeddings, rerank, tei, responses, messages,
                                            interactive, tokenize, health, playground)]
    for router in (*routers, tei.info_router, responses.stored_router, files.router, batches.router):
        app.include_router(router)
    # Innermost, inside the body limit, the keys and the metrics: every JSON route without FastAPI's machinery.
    app.add_middleware(LeanRoutes, routers=routers)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes,
                       paths={"/v1/files": settings.batch_file_max_bytes})  # uploads: their own limit
    install_auth(app, settings)  # outside the body limit: a request without a key is refused unread
    install_metrics(app, settings.access_log)
    return app
