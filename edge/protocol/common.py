"""Base for request models: unknown fields are ignored (clients such as LangChain send extras)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class OpenAIRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


def is_token_ids(value: object) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)
