"""POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import Request, Response

from edge.generate import generate
from edge.protocol.chat import ChatCompletionRequest, ChatShape
from edge.routing import STREAM_RESPONSE, api_router
from tritongate.llm.v1 import llm_pb2

router = api_router()


def to_proto(body: ChatCompletionRequest) -> llm_pb2.GenerateRequest:
    messages = [llm_pb2.ChatMessage(role=m.role, content=m.content, name=m.name or "") for m in body.messages]
    return body.proto(body.max_completion_tokens or body.max_tokens, chat=llm_pb2.Chat(messages=messages),
                      logprobs=bool(body.logprobs), top_logprobs=body.top_logprobs or 0)


@router.post("/v1/chat/completions", tags=["chat"], responses=STREAM_RESPONSE)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    body.check()
    _, backend = await request.app.state.directory.route(body.model, "llm")
    return await generate(request, backend, to_proto(body), ChatShape(bool(body.logprobs)),
                          stream=bool(body.stream), include_usage=body.include_usage)
