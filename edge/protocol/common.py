"""Base for request models: unknown fields are ignored (clients such as LangChain send extras)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class OpenAIRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


def is_token_ids(value: object) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)


UINT32_MAX = 2**32 - 1  # the services' counts are uint32: a larger value is refused here, not crashed on
BATCH_SHAPES = "a string, an array of strings, an array of token ids, or an array of token-id arrays"


def batch_schema(empty_strings: bool) -> dict[str, Any]:
    """What `text_or_token_batch` accepts, as the JSON schema /openapi.json declares."""
    text = {"type": "string"} if empty_strings else {"type": "string", "minLength": 1}
    ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": UINT32_MAX}}
    return {"anyOf": [text, {"type": "array", "minItems": 1, "items": text}, ids,
                      {"type": "array", "minItems": 1, "items": ids}]}


def text_or_token_batch(value: Any, param: str, empty_strings: bool) -> list[str] | list[list[int]]:
    """OpenAI's `input` (embeddings) and `prompt` (completions): one or many texts or token-id lists,
    normalised to a list of strings or a list of token-id lists, with messages naming `param`."""
    if isinstance(value, str) or (is_token_ids(value) and value):
        value = [value]
    if not isinstance(value, list):
        raise ValueError(f"'{param}' must be {BATCH_SHAPES}")
    if not value:
        raise ValueError(f"'{param}' must not be empty")
    if all(isinstance(item, str) for item in value):
        if not empty_strings and any(item == "" for item in value):
            raise ValueError(f"'{param}' must not contain empty strings")
        return value
    if all(is_token_ids(item) for item in value):
        for ids in value:
            if not ids:
                raise ValueError(f"'{param}' must not contain empty token arrays")
            if any(t < 0 or t >= 2**32 for t in ids):
                raise ValueError("token ids must be between 0 and 2^32 - 1")
        return value
    raise ValueError(f"'{param}' must be {BATCH_SHAPES}")
