"""The Files API for batches: POST /v1/files (multipart, purpose `batch`, JSON Lines up to
TRITONGATE_BATCH_FILE_MAX_BYTES: 413 beyond), GET /v1/files, GET /v1/files/{id}, GET /v1/files/{id}/content,
DELETE /v1/files/{id} (edge/batches/files.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from fastapi import File, Form, Query, Request, Response, UploadFile

from edge.api_router import api_router, ok
from edge.batches import files, schemas
from edge.batches.batches import batches_of, key_name
from edge.errors import bad_request

router = api_router(tags=["files"])


def _json(payload: Any) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


@router.post("/v1/files", responses=ok(schemas.OpenAIFile))
async def upload_file(file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()], request: Request
                      ) -> Response:
    if purpose != "batch":
        raise bad_request("`purpose` must be 'batch' (the only purpose this server takes).", "purpose")
    record = await batches_of(request).files.create(key_name(request), file.filename or "upload.jsonl", purpose,
                                                    file.file)
    return _json(files.public(record))


@router.get("/v1/files", responses=ok(schemas.ListFilesResponse))
async def list_files(request: Request, purpose: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
                     order: Literal["asc", "desc"] = "desc", after: str | None = None) -> Response:
    listed = await batches_of(request).files.listed(key_name(request), purpose)
    if order == "asc":
        listed.reverse()
    return _json(schemas.page([files.public(record) for record in listed], after, limit))


@router.get("/v1/files/{file_id}", responses=ok(schemas.OpenAIFile))
async def retrieve_file(file_id: str, request: Request) -> Response:
    return _json(files.public(await batches_of(request).files.get(key_name(request), file_id)))


@router.get("/v1/files/{file_id}/content",
            responses={200: {"model": schemas.BatchLine, "content": {"application/jsonl": {}},
                             "description": "The file's bytes; a batch's output or error file holds JSON Lines, "
                                            "each a BatchLine"}})
async def retrieve_file_content(file_id: str, request: Request) -> Response:
    content = await batches_of(request).files.content(key_name(request), file_id)
    return Response(content, media_type="application/jsonl")


@router.delete("/v1/files/{file_id}", responses=ok(schemas.DeleteFileResponse))
async def delete_file(file_id: str, request: Request) -> Response:
    await batches_of(request).files.delete(key_name(request), file_id)
    return _json({"id": file_id, "object": "file", "deleted": True})
