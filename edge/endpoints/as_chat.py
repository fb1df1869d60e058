"""For endpoints served as chat requests (Responses, LMDeploy's interactive chat): the chat request they
become, validated by chat's own rules, with the errors naming the endpoint's own parameters."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from edge.endpoints.chat import ChatCompletionRequest
from edge.errors import OpenAIError, from_validation


def validated_chat(fields: dict[str, Any], names: dict[str, str]) -> ChatCompletionRequest:
    """`fields` as a ChatCompletionRequest; a refused chat parameter is reported under `names[param]`."""
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        raise renamed(from_validation(RequestValidationError(exc.errors())), names) from None


def renamed(error: OpenAIError, names: dict[str, str]) -> OpenAIError:
    """`error` naming the endpoint's parameter where it names a chat parameter the endpoint calls otherwise."""
    if error.param:
        head = error.param.split("[")[0].split(".")[0]
        error.param = names.get(head, error.param)
    return error


@contextmanager
def chat_params_renamed(names: dict[str, str]) -> Iterator[None]:
    """The llm service's refusals of the chat request (e.g. a `response_format` the backend cannot enforce)
    name the endpoint's parameters too."""
    try:
        yield
    except OpenAIError as exc:
        raise renamed(exc, names) from None
