"""A batch's input lines (each request, or why it cannot run), its output and error lines in OpenAI's
format, and its record's counting (a line counted once, however often it is answered)."""

from __future__ import annotations

import orjson
import pytest

from edge.batches import lines, records

CHAT = "/v1/chat/completions"


def request(custom_id: object = "a", url: object = CHAT, body: object = None, **extra: object) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url,
                         "body": {"model": "m", "messages": []} if body is None else body, **extra})


def test_good_lines_keep_their_order_and_body_and_blank_lines_are_skipped() -> None:
    content = request("a") + b"\n\n" + request("b", body={"model": "x"}) + b"\n"
    parsed = lines.parse(content, CHAT)
    assert [(line.index, line.line_number, line.custom_id, line.error) for line in parsed] == [
        (0, 1, "a", None), (1, 3, "b", None)]
    assert orjson.loads(parsed[1].body or b"") == {"model": "x"}


@pytest.mark.parametrize(("text", "code", "custom_id"), [
    (b"{not json", "invalid_json_line", None),
    (b"[1, 2]", "invalid_json_line", None),
    (request(custom_id=""), "missing_required_parameter", None),
    (request(custom_id=7), "missing_required_parameter", None),
    (request(url="/v1/embeddings"), "invalid_url", "a"),
    (request(url="/v1/moderations"), "invalid_url", "a"),
    (request(method="GET"), "invalid_method", "a"),
    (request(body="text"), "missing_required_parameter", "a"),
    (request(body={"model": "m", "stream": True}), "invalid_body", "a"),
])
def test_a_bad_line_is_refused_with_its_code_and_line_number(text: bytes, code: str, custom_id: str | None) -> None:
    (line,) = lines.parse(b"\n" + text, CHAT)
    assert line.body is None and line.error is not None
    assert (line.error.code, line.custom_id) == (code, custom_id)
    assert line.error.message.startswith("Line 2: ")


def test_duplicate_custom_ids_are_named_once_each() -> None:
    parsed = lines.parse(b"\n".join([request("a"), request("b"), request("a"), request("a"), b"{"]), CHAT)
    assert lines.duplicate_ids(parsed) == ["a"]


def test_output_and_error_lines_have_openais_shape() -> None:
    (line,) = lines.parse(request("x"), CHAT)
    out = orjson.loads(lines.response_line("batch_1", line, 200, "req-1", b'{"id":"c","choices":[]}'))
    assert out == {"id": lines.line_id("batch_1", 0), "custom_id": "x",
                   "response": {"status_code": 200, "request_id": "req-1", "body": {"id": "c", "choices": []}},
                   "error": None}
    assert out["id"].startswith("batch_req_") and out["id"] == lines.line_id("batch_1", 0) != lines.line_id("b", 0)
    text = orjson.loads(lines.response_line("batch_1", line, 502, "", b"not json"))
    assert text["response"]["body"] == "not json"
    error = orjson.loads(lines.error_line("batch_1", line, lines.LineError("batch_expired", "too late")))
    assert error == {"id": out["id"], "custom_id": "x", "response": None,
                     "error": {"code": "batch_expired", "message": "too late"}}


@pytest.mark.parametrize(("window", "seconds"), [("24h", 86400), ("30m", 1800), ("90s", 90), ("25h", None),
                                                 ("0s", None), ("1d", None), ("24 h", None)])
def test_completion_windows(window: str, seconds: int | None) -> None:
    assert records.window_s(window) == seconds


def test_a_line_is_counted_once_however_often_it_is_answered() -> None:
    record = records.new("batch_1", None, CHAT, "file-1", "24h", None, total=9, now=100)
    assert record["status"] == "validating" and record["expires_at"] == 100 + 86400
    assert "_owner" not in records.public(record) and "_answered" not in records.public(record)
    for index, ok in ((0, True), (8, False), (5, True)):
        record = records.count_answer(record, index, ok) or {}
    assert records.count_answer(record, 8, True) is None
    assert record["request_counts"] == {"total": 9, "completed": 2, "failed": 1}
    assert records.unanswered(record) == [1, 2, 3, 4, 6, 7]
