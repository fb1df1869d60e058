"""POST /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from edge.generate import generate
from edge.protocol.completions import CompletionRequest, CompletionShape
from edge.protocol.generation import set_sampling
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

router = APIRouter()


def to_proto(body: CompletionRequest) -> llm_pb2.GenerateRequest:
    prompts = [llm_pb2.Prompt(text=p) if isinstance(p, str) else llm_pb2.Prompt(token_ids=common_pb2.TokenIds(ids=p))
               for p in body.prompt]
    request = llm_pb2.GenerateRequest(
        model=body.model,
        prompts=llm_pb2.Prompts(prompts=prompts),
        n=body.n or 1,
        stop=body.stop or [],
        logit_bias=body.logit_bias or {},
        logprobs=body.logprobs is not None,
        top_logprobs=body.logprobs or 0,
        echo=bool(body.echo),
    )
    if body.max_tokens is not None:
        request.max_tokens = body.max_tokens
    set_sampling(request, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                 repetition_penalty=body.repetition_penalty, presence_penalty=body.presence_penalty,
                 frequency_penalty=body.frequency_penalty, seed=body.seed, do_sample=body.do_sample)
    return request


@router.post("/v1/completions", tags=["completions"])
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    body.check()
    _, backend = await request.app.state.directory.route(body.model, "llm")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await generate(request, backend, to_proto(body), CompletionShape(body.logprobs is not None),
                          stream=bool(body.stream), include_usage=include_usage)
