"""The TokenizerService every service runs beside its own: a model's tokenizer, for the edge's /tokenize
and /detokenize. Tokenizing needs no Triton, so it answers while the Triton model is not ready."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

from services.common.errors import invalid_argument, rpc
from tritongate.common.v1 import tokenizer_pb2, tokenizer_pb2_grpc

if TYPE_CHECKING:
    from services.common.server import ModelSet


class TokenizerServicer(tokenizer_pb2_grpc.TokenizerServiceServicer):
    def __init__(self, models: ModelSet[Any]) -> None:
        self.models = models

    @rpc
    async def Tokenize(self, request: tokenizer_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
                       ) -> tokenizer_pb2.TokenizeResponse:
        model = self.models.get(request.model)
        kind = request.WhichOneof("input")
        if kind == "chat":
            tokens = model.chat_tokens(request.chat)
        elif kind == "generation":
            tokens = model.generation_tokens(request.generation)
        elif request.spans:
            return _with_spans(model.tokenizer, request, model.card().max_model_len)
        else:
            tokens = list(model.tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens))
        return tokenizer_pb2.TokenizeResponse(tokens=tokens, max_model_len=model.card().max_model_len)

    @rpc
    async def Detokenize(self, request: tokenizer_pb2.DetokenizeRequest, context: grpc.aio.ServicerContext
                         ) -> tokenizer_pb2.DetokenizeResponse:
        model = self.models.get(request.model)
        vocab = len(model.tokenizer)
        bad = next((t for t in request.tokens if t >= vocab), None)
        if bad is not None:
            raise invalid_argument(f"`tokens` contains token id {bad}, outside the vocabulary of `{model.name}` "
                                   f"(0..{vocab - 1}).", "tokens")
        return tokenizer_pb2.DetokenizeResponse(prompt=str(model.tokenizer.decode(list(request.tokens))))


def _with_spans(tokenizer: Any, request: tokenizer_pb2.TokenizeRequest, max_model_len: int
                ) -> tokenizer_pb2.TokenizeResponse:
    """The prompt's tokens with the text each stands for (TEI's /tokenize); needs a fast tokenizer."""
    if not getattr(tokenizer, "is_fast", False):
        raise invalid_argument(f"`{request.model}` has no fast tokenizer to tell token offsets", "model")
    encoding = tokenizer(request.prompt, add_special_tokens=request.add_special_tokens,
                         return_offsets_mapping=True, return_special_tokens_mask=True)
    ids, pieces = encoding["input_ids"], tokenizer.convert_ids_to_tokens(encoding["input_ids"])
    spans = [tokenizer_pb2.TokenSpan(text=piece if special else request.prompt[start:stop], special=bool(special),
                                     start=start, stop=stop)
             for piece, special, (start, stop) in zip(pieces, encoding["special_tokens_mask"],
                                                       encoding["offset_mapping"], strict=True)]
    return tokenizer_pb2.TokenizeResponse(tokens=ids, max_model_len=max_model_len, spans=spans)
