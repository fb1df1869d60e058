"""POST /v1/embeddings request, in the order of OpenAI's CreateEmbeddingRequest."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema, field_validator

from edge.protocol.common import UINT32_MAX, OpenAIRequest, batch_schema, text_or_token_batch


class EmbeddingRequest(OpenAIRequest):
    input: Annotated[Any, WithJsonSchema(batch_schema(empty_strings=False))]
    model: str
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1, le=UINT32_MAX)] | None = None
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _input(cls, value: Any) -> list[str] | list[list[int]]:
        return text_or_token_batch(value, "input", empty_strings=False)
