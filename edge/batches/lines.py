"""A batch's lines: the input file's JSON Lines read into requests (or refusals, each answered by an error
line while the rest run), and the output and error files' lines in OpenAI's format:
`{"id", "custom_id", "response": {"status_code", "request_id", "body"} | null, "error": {"code", "message"} | null}`.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson

# The routes a batch may call; a batch names one and every line must name the same.
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/rerank")


@dataclass(frozen=True)
class LineError:
    code: str
    message: str


@dataclass(frozen=True)
class Line:
    """One request of a batch: its place among the file's non-blank lines (`index`), its line number in the
    file, its custom_id (None when the line has none), and either the body to send or why it cannot run."""

    index: int
    line_number: int
    custom_id: str | None
    body: bytes | None
    error: LineError | None = None


def _refused(index: int, number: int, custom_id: str | None, code: str, message: str) -> Line:
    return Line(index, number, custom_id, None, LineError(code, f"Line {number}: {message}"))


def parse_line(text: bytes, index: int, number: int, endpoint: str) -> Line:
    """One non-blank line of the input file, for a batch of `endpoint`."""
    try:
        request = orjson.loads(text)
    except orjson.JSONDecodeError:
        return _refused(index, number, None, "invalid_json_line", "not a JSON object.")
    if not isinstance(request, dict):
        return _refused(index, number, None, "invalid_json_line", "not a JSON object.")
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _refused(index, number, None, "missing_required_parameter",
                        "`custom_id` must be a non-empty string.")
    url = request.get("url")
    if url != endpoint:
        allowed = "a batch of another endpoint" if url in ENDPOINTS else "not an endpoint a batch may call"
        return _refused(index, number, custom_id, "invalid_url",
                        f"`url` {url!r} is {allowed}; every line of this batch must name {endpoint!r}.")
    if request.get("method", "POST") != "POST":
        return _refused(index, number, custom_id, "invalid_method", "`method` must be 'POST'.")
    body = request.get("body")
    if not isinstance(body, dict):
        return _refused(index, number, custom_id, "missing_required_parameter", "`body` must be a JSON object.")
    if body.get("stream"):
        return _refused(index, number, custom_id, "invalid_body", "`body.stream` is not supported in a batch.")
    return Line(index, number, custom_id, orjson.dumps(body))


def parse(content: bytes, endpoint: str) -> list[Line]:
    """Every non-blank line of `content`, in order."""
    lines: list[Line] = []
    for number, text in enumerate(content.splitlines(), start=1):
        if text.strip():
            lines.append(parse_line(text, len(lines), number, endpoint))
    return lines


def duplicate_ids(lines: list[Line]) -> list[str]:
    """The custom_ids that more than one line carries, in the order they first appear."""
    counts = Counter(line.custom_id for line in lines if line.custom_id is not None)
    return [custom_id for custom_id, count in counts.items() if count > 1]


def line_id(batch_id: str, index: int) -> str:
    """A line's answer id: the same each time the line is answered (a batch resumed elsewhere)."""
    return "batch_req_" + hashlib.sha256(f"{batch_id}:{index}".encode()).hexdigest()[:32]


def _json(body: bytes) -> Any:
    """A response body as it goes into a line: its JSON as is, or else its text."""
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace")
    return orjson.Fragment(body)


def response_line(batch_id: str, line: Line, status: int, request_id: str, body: bytes) -> bytes:
    """The answer of a line that ran: an output line (2xx) or an error line with the response."""
    return orjson.dumps({"id": line_id(batch_id, line.index), "custom_id": line.custom_id,
                         "response": {"status_code": status, "request_id": request_id, "body": _json(body)},
                         "error": None})


def error_line(batch_id: str, line: Line, error: LineError) -> bytes:
    """The answer of a line that did not run."""
    return orjson.dumps({"id": line_id(batch_id, line.index), "custom_id": line.custom_id, "response": None,
                         "error": {"code": error.code, "message": error.message}})
