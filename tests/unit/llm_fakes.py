"""A scripted Triton for the LLM unit tests: a model configuration as `get_model_config` returns it, and
streamed responses (dicts of numpy outputs) replayed for every request, which it records."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.common.triton import ReadinessUnknown

Response = dict[str, np.ndarray]


def triton_config(inputs: Mapping[str, str], outputs: Mapping[str, str], *, batched: bool = True,
                  decoupled: bool = True, **extra: Any) -> dict[str, Any]:
    """A Triton model configuration in get_model_config's JSON shape (types without TYPE_)."""
    config: dict[str, Any] = {
        "name": "m",
        "input": [{"name": name, "data_type": f"TYPE_{kind}"} for name, kind in inputs.items()],
        "output": [{"name": name, "data_type": f"TYPE_{kind}"} for name, kind in outputs.items()],
        **extra,
    }
    if batched:
        config["max_batch_size"] = 8
    if decoupled:
        config["model_transaction_policy"] = {"decoupled": True}
    return config


def texts(*pieces: str) -> list[Response]:
    """Responses of a text backend: one `text_output` each, batched as [1, 1]."""
    return [{"text_output": np.array([[piece.encode()]], dtype=np.object_)} for piece in pieces]


@dataclass
class Request:
    inputs: Mapping[str, np.ndarray]
    outputs: list[str]
    request_id: str


@dataclass
class FakeTriton:
    config: dict[str, Any] = field(default_factory=dict)
    responses: list[Response] | Callable[[Mapping[str, np.ndarray]], list[Response]] = field(default_factory=list)
    ready: bool | None = True  # None: the readiness check gets no answer in time
    resolve_every_s: float = 5.0
    requests: list[Request] = field(default_factory=list)
    closed: int = 0

    async def why_not_ready(self, url: str, model: str) -> str | None:
        if self.ready is None:
            raise ReadinessUnknown("no answer within 2 s")
        return None if self.ready else "Triton reports it not ready"

    async def model_config(self, url: str, model: str) -> dict[str, Any]:
        return self.config

    async def stream(self, url: str, model: str, inputs: Mapping[str, np.ndarray], outputs: list[str],
                     timeout: float | None, request_id: str = "") -> AsyncIterator[Response]:
        self.requests.append(Request(inputs, outputs, request_id))
        responses = self.responses(inputs) if callable(self.responses) else self.responses
        try:
            for response in responses:
                yield {name: array for name, array in response.items() if name in outputs}
        finally:
            self.closed += 1
