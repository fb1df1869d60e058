"""Reading the edge's SSE streams in tests, and validating completion chunks against OpenAI's schema."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import cache
from typing import Any

import httpx
import jsonschema

from tests.support.openai_schema import _document


@dataclass
class Event:
    name: str | None
    data: str


def parse_events(text: str) -> list[Event]:
    """SSE events (comments skipped); multi-line data joined with newlines."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        if data:
            events.append(Event(name, "\n".join(data)))
    return events


def stream_events(http: httpx.Client, path: str, body: dict[str, Any]) -> list[Event]:
    with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return parse_events(response.read().decode())


def stream_chunks(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks of a stream that must end normally: JSON data events, then exactly one [DONE], last."""
    events = stream_events(http, path, body)
    assert [e.data for e in events].count("[DONE]") == 1 and events[-1].data == "[DONE]"
    assert all(e.name is None for e in events), [e for e in events if e.name]
    return [json.loads(e.data) for e in events[:-1]]


@cache
def _completion_chunk_schema() -> dict[str, Any]:
    """OpenAI's document types completion stream chunks as CreateCompletionResponse, while its API sends
    `finish_reason: null` until a choice ends and, with include_usage, `usage: null` until the last
    chunk. Exactly those two nulls are allowed here."""
    document = copy.deepcopy(_document())
    response = document["components"]["schemas"]["CreateCompletionResponse"]
    finish = response["properties"]["choices"]["items"]["properties"]["finish_reason"]
    finish["type"] = [finish["type"], "null"]
    finish["enum"] = [*finish["enum"], None]
    response["properties"]["usage"] = {"anyOf": [response["properties"]["usage"], {"type": "null"}]}
    return {"$ref": "#/components/schemas/CreateCompletionResponse", **document}


def validate_completion_chunk(chunk: dict[str, Any]) -> None:
    jsonschema.validate(chunk, _completion_chunk_schema(), cls=jsonschema.Draft202012Validator)
