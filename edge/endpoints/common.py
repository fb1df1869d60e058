"""What every endpoint module shares: the request base, the schema of OpenAI's `usage`, and the
text-or-token-ids batches that embeddings `input` and completions `prompt` accept.

Endpoint modules own the OpenAI request shape. Their rules raise `ParamError` (edge/errors.py; never an
HTTP error): inside a pydantic validator it becomes a validation error whose `param` the error handler reads.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from edge.errors import ParamError
from tritongate.common.v1 import common_pb2

UINT32_MAX = 2**32 - 1  # the services' counts are uint32: a larger value is refused here, not crashed on
BATCH_SHAPES = "a string, an array of strings, an array of token ids, or an array of token-id arrays"


class OpenAIRequest(BaseModel):
    """Unknown fields are ignored (clients such as LangChain send extras)."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class ResponseModel(BaseModel):
    """A response's schema, declared in /openapi.json. Responses are written as JSON bytes straight from
    the service's answer; these classes describe them and are not built on the hot path."""


class Head(ResponseModel):
    """What every chat and completions response and stream chunk starts with."""

    id: str
    created: int
    model: str


class CompletionTokensDetails(ResponseModel):
    reasoning_tokens: int


class PromptTokensDetails(ResponseModel):
    cached_tokens: int


class Usage(ResponseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None  # when the backend reported reusing its cache
    completion_tokens_details: CompletionTokensDetails | None = None  # when the model reasoned


def usage_object(usage: common_pb2.Usage) -> dict[str, Any]:
    counts: dict[str, Any] = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                              "total_tokens": usage.total_tokens}
    if usage.cached_tokens:
        counts["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    if usage.reasoning_tokens:
        counts["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    return counts


def is_token_ids(value: object) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)


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
        raise ParamError(f"'{param}' must be {BATCH_SHAPES}", param)
    if not value:
        raise ParamError(f"'{param}' must not be empty", param)
    if all(isinstance(item, str) for item in value):
        if not empty_strings and any(item == "" for item in value):
            raise ParamError(f"'{param}' must not contain empty strings", param)
        return value
    if all(is_token_ids(item) for item in value):
        for ids in value:
            if not ids:
                raise ParamError(f"'{param}' must not contain empty token arrays", param)
            if any(t < 0 or t > UINT32_MAX for t in ids):
                raise ParamError("token ids must be between 0 and 2^32 - 1", param)
        return value
    raise ParamError(f"'{param}' must be {BATCH_SHAPES}", param)


def check_count(items: int, most: int, param: str, per_request: bool = False) -> None:
    """One of the edge's per-request limits (edge/app_state.py, `limits_of`): more than `most` items of
    `param` are refused."""
    if items > most:
        per = " per request" if per_request else ""
        raise ParamError(f"'{param}' has {items} items; at most {most} are allowed{per}.", param)


def token_ids(ids: list[int]) -> common_pb2.TokenIds:
    return common_pb2.TokenIds(ids=ids)
