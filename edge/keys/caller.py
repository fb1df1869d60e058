"""Who is calling, for the rest of the request: the key's policy, the request's priority and the model
slots it holds (edge/queue.py). The keys middleware (edge/auth.py) sets it; the model directory asks it
whether the key may use a model (edge/clients.py), the service clients wait for a slot through it, and
the request models give it the body's `priority` (`Prioritized`)."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Annotated, Self

from pydantic import BaseModel, Field, StrictInt, model_validator

from edge.keys.policy import MAX_PRIORITY, MIN_PRIORITY, KeyPolicy
from edge.queue import BATCH, ModelGate, ModelGates


@dataclass(slots=True)
class Caller:
    key: KeyPolicy | None  # None: authentication is off
    priority: int  # the header's, else the key's default, else 0; BATCH for the gateway's own batch requests
    gates: ModelGates | None = None
    body_priority: int | None = None
    held: dict[str, ModelGate] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.key.name if self.key is not None else ""

    def effective_priority(self) -> int:
        if self.priority >= BATCH or self.body_priority is None:
            return self.priority
        return self.body_priority

    def allows(self, model: str) -> bool:
        return self.key is None or self.key.allows(model)

    async def enter(self, model: str) -> None:
        """Wait for a slot of `model` (once per request and model); held until `leave`."""
        gate = self.gates.gate(model) if self.gates is not None else None
        if gate is None or model in self.held:
            return
        await gate.acquire(self.effective_priority(), self.name)
        self.held[model] = gate

    def leave(self) -> None:
        for gate in self.held.values():
            gate.release()
        self.held.clear()


CALLER: ContextVar[Caller | None] = ContextVar("caller", default=None)


def caller() -> Caller | None:
    return CALLER.get()


Priority = Annotated[StrictInt, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY)]


class Prioritized(BaseModel):
    """A request body's `priority` (vLLM's: an integer, lower is served earlier, 0 by default), handed to
    the request's caller once the body is valid."""

    priority: Priority | None = None

    @model_validator(mode="after")
    def _note_priority(self) -> Self:
        current = CALLER.get()
        if current is not None and self.priority is not None:
            current.body_priority = self.priority
        return self
