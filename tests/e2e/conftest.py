"""The end-to-end tests' own fixture: `backend`, each echo model of tests/triton_models in turn (one per
Triton LLM interface; tests.support.backends says what each can do)."""

from __future__ import annotations

import pytest

from tests.support.backends import ECHO_BACKENDS, EchoBackend


@pytest.fixture(params=ECHO_BACKENDS, ids=str)
def backend(request: pytest.FixtureRequest) -> EchoBackend:
    return request.param  # type: ignore[no-any-return]
