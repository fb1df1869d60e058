"""POST /v1/completions."""

from __future__ import annotations

from fastapi import Request, Response

from edge.generate import generate
from edge.protocol.completions import CompletionRequest, CompletionShape
from edge.routing import STREAM_RESPONSE, api_router
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

router = api_router()


def to_proto(body: CompletionRequest) -> llm_pb2.GenerateRequest:
    prompts = [llm_pb2.Prompt(text=p) if isinstance(p, str) else llm_pb2.Prompt(token_ids=common_pb2.TokenIds(ids=p))
               for p in body.prompt]
    return body.proto(body.max_tokens, prompts=llm_pb2.Prompts(prompts=prompts), echo=bool(body.echo),
                      logprobs=body.logprobs is not None, top_logprobs=body.logprobs or 0)


@router.post("/v1/completions", tags=["completions"], responses=STREAM_RESPONSE)
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    body.check()
    _, backend = await request.app.state.directory.route(body.model, "llm")
    return await generate(request, backend, to_proto(body), CompletionShape(body.logprobs is not None),
                          stream=bool(body.stream), include_usage=body.include_usage)
