"""The Batch API's shapes as /openapi.json declares them (OpenAI's `OpenAIFile`, `Batch` and their lists),
and the paging that both lists share."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from edge.errors import bad_request


class OpenAIFile(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None = None
    filename: str
    purpose: Literal["batch", "batch_output"]
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: str | None = None


class ListFilesResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIFile]
    first_id: str | None
    last_id: str | None
    has_more: bool


class DeleteFileResponse(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


class CreateBatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str = Field(description="/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses "
                                      "or /v1/rerank")
    completion_window: str = Field(description="'24h' as OpenAI, or a shorter window in the same form ('30m', "
                                               "'90s')")
    metadata: dict[str, str] | None = None


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class BatchRequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class Batch(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                    "cancelled"]
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: BatchRequestCounts
    metadata: dict[str, str] | None = None


class ListBatchesResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool


class BatchResponse(BaseModel):
    status_code: int
    request_id: str
    body: Any


class BatchLineError(BaseModel):
    code: str
    message: str


class BatchLine(BaseModel):
    """A line of a batch's output or error file: the answer to the input line with the same custom_id."""

    id: str
    custom_id: str | None
    response: BatchResponse | None
    error: BatchLineError | None


def page(items: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """A list's page: up to `limit` items after the one whose id is `after` (from the start when None)."""
    start = 0
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise bad_request(f"No object with id {after!r} to list after.", "after")
        start = ids.index(after) + 1
    data = items[start:start + limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": start + limit < len(items)}
