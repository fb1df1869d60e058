"""POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from edge.generate import generate
from edge.protocol.chat import ChatCompletionRequest, ChatShape
from edge.protocol.generation import set_sampling
from tritongate.llm.v1 import llm_pb2

router = APIRouter()


def to_proto(body: ChatCompletionRequest) -> llm_pb2.GenerateRequest:
    request = llm_pb2.GenerateRequest(
        model=body.model,
        chat=llm_pb2.Chat(messages=[llm_pb2.ChatMessage(role=m.role, content=m.content, name=m.name or "")
                                    for m in body.messages]),
        n=body.n or 1,
        stop=body.stop or [],
        logit_bias=body.logit_bias or {},
        logprobs=bool(body.logprobs),
        top_logprobs=body.top_logprobs or 0,
    )
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is not None:
        request.max_tokens = max_tokens
    set_sampling(request, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                 repetition_penalty=body.repetition_penalty, presence_penalty=body.presence_penalty,
                 frequency_penalty=body.frequency_penalty, seed=body.seed, do_sample=body.do_sample)
    return request


@router.post("/v1/chat/completions", tags=["chat"])
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    body.check()
    _, backend = await request.app.state.directory.route(body.model, "llm")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await generate(request, backend, to_proto(body), ChatShape(bool(body.logprobs)),
                          stream=bool(body.stream), include_usage=include_usage)
