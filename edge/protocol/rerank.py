"""Rerank requests: the seed's /v1/rerank (also Cohere's and Jina's shape) and TEI's /rerank."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, WithJsonSchema, field_validator

from edge.protocol.common import OpenAIRequest


def _text(value: Any, i: int) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return str(value["text"])
    raise ValueError(f"documents[{i}] must be a string or an object with a string `text`")


# What the validators accept, as /openapi.json declares it.
DOCUMENTS = {"type": "array", "minItems": 1, "items": {"anyOf": [
    {"type": "string"}, {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}]}}
TOP_N = {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]}  # numeric strings pass too (the seed's)


class RerankRequest(OpenAIRequest):
    """The seed's request; `documents` may also be Cohere/Jina objects with `text`."""

    model: str
    query: Annotated[str, Field(min_length=1)]
    documents: Annotated[list[Any], WithJsonSchema(DOCUMENTS)]
    top_n: Annotated[int | None, WithJsonSchema(TOP_N)] = None
    return_documents: bool = False

    @field_validator("documents")
    @classmethod
    def _documents(cls, value: list[Any]) -> list[str]:
        if not value:
            raise ValueError("'documents' must not be empty")
        return [_text(item, i) for i, item in enumerate(value)]

    @field_validator("top_n", mode="before")
    @classmethod
    def _top_n(cls, value: Any) -> Any:
        """An int, or a numeric string as the seed allows; at least 1."""
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError("'top_n' must be an integer")
        if value is not None and value < 1:
            raise ValueError("'top_n' must be at least 1")
        return value


class TEIRerankRequest(OpenAIRequest):
    """Hugging Face text-embeddings-inference's /rerank."""

    model: str | None = None
    query: Annotated[str, Field(min_length=1)]
    texts: Annotated[list[str], Field(min_length=1)]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False
