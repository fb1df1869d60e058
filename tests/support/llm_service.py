"""An llm service of its own for a service test: a model configuration (the session's, edited by the test)
served by a real llm service on a free port, and a stub on it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc

from services.common.server import RunningService, start_service
from services.common.triton import Triton
from services.llm.main import build
from tritongate.config import load_model_config
from tritongate.llm.v1 import llm_pb2_grpc


@asynccontextmanager
async def llm_service(config: dict[str, Any], folder: Path) -> AsyncIterator[RunningService]:
    """The llm service of `config` (written to `folder/model_config.json`), serving until the block ends."""
    path = folder / "model_config.json"
    path.write_text(json.dumps(config))
    triton = Triton()
    running = await start_service(build(load_model_config(path), triton), triton, host="127.0.0.1", port=0)
    try:
        yield running
    finally:
        await running.stop(1)


@asynccontextmanager
async def llm_stub(service: RunningService) -> AsyncIterator[llm_pb2_grpc.LlmServiceStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        yield llm_pb2_grpc.LlmServiceStub(channel)
