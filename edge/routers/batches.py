"""The Batch API: POST /v1/batches, GET /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel
(edge/batches/); the edge runs the batches itself (edge/batches/runner.py)."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import Query, Request, Response

from edge.api_router import api_router, ok
from edge.batches import records, schemas
from edge.batches.batches import batches_of, key_name

router = api_router(tags=["batches"])


def _json(payload: Any) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


@router.post("/v1/batches", responses=ok(schemas.Batch))
async def create_batch(body: schemas.CreateBatchRequest, request: Request) -> Response:
    record = await batches_of(request).create(key_name(request), body.input_file_id, body.endpoint,
                                              body.completion_window, body.metadata)
    return _json(records.public(record))


@router.get("/v1/batches", responses=ok(schemas.ListBatchesResponse))
async def list_batches(request: Request, after: str | None = None,
                       limit: Annotated[int, Query(ge=1, le=100)] = 20) -> Response:
    listed = await batches_of(request).listed(key_name(request))
    return _json(schemas.page([records.public(record) for record in listed], after, limit))


@router.get("/v1/batches/{batch_id}", responses=ok(schemas.Batch))
async def retrieve_batch(batch_id: str, request: Request) -> Response:
    return _json(records.public(await batches_of(request).get(key_name(request), batch_id)))


@router.post("/v1/batches/{batch_id}/cancel", responses=ok(schemas.Batch))
async def cancel_batch(batch_id: str, request: Request) -> Response:
    return _json(records.public(await batches_of(request).cancel(key_name(request), batch_id)))
