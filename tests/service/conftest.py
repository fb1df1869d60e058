"""What the llm service's test modules share: a stub on the module's own llm service (its `service`
fixture, tests/support/llm_service.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.common.server import RunningService
from tests.support.llm_service import llm_stub
from tritongate.llm.v1 import llm_pb2_grpc


@pytest.fixture
async def stub(service: RunningService) -> AsyncIterator[llm_pb2_grpc.LlmServiceStub]:
    async with llm_stub(service) as stub:
        yield stub
