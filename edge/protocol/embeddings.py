"""POST /v1/embeddings request, in the order of OpenAI's CreateEmbeddingRequest."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from edge.protocol.common import OpenAIRequest, is_token_ids

INPUT_SHAPES = "a string, an array of strings, an array of token ids, or an array of token-id arrays"


class EmbeddingRequest(OpenAIRequest):
    input: Any
    model: str
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _input(cls, value: Any) -> str | list[str] | list[list[int]]:
        """Normalise to a list of strings or a list of token-id lists, with clear messages."""
        if isinstance(value, str) or (is_token_ids(value) and value):
            value = [value]
        if not isinstance(value, list):
            raise ValueError(f"'input' must be {INPUT_SHAPES}")
        if not value:
            raise ValueError("'input' must not be empty")
        if all(isinstance(item, str) for item in value):
            if any(item == "" for item in value):
                raise ValueError("'input' must not contain empty strings")
            return value
        if all(is_token_ids(item) for item in value):
            for ids in value:
                if not ids:
                    raise ValueError("'input' must not contain empty token arrays")
                if any(t < 0 or t >= 2**32 for t in ids):
                    raise ValueError("token ids must be between 0 and 2^32 - 1")
            return value
        raise ValueError(f"'input' must be {INPUT_SHAPES}")
