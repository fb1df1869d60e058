"""One LLM: prompts and chats → token ids, generation on its Triton backend, tokens → text deltas."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, struct_pb2

from services.common.errors import invalid_argument
from services.common.server import ServedModel
from services.common.tokenizer import load_tokenizer
from services.common.triton import Triton
from services.llm.backends import LlmBackend, Sampling
from services.llm.chat import load_chat_template
from services.llm.completion import Completion, coalesce, merge
from services.llm.detokenizer import TokenDecoding
from services.llm.fastertransformer import FasterTransformer
from services.llm.params import (
    GenerationPolicy,
    PromptParam,
    check_request,
    choice_seeds,
    for_choice,
    max_new_tokens,
    sampling,
)
from tritongate.common.v1 import common_pb2
from tritongate.config import ConfigError, LlmModel, ModelInfo
from tritongate.llm.v1 import llm_pb2
from tritongate.logs import REQUEST_ID
from tritongate.registry import LLM

log = logging.getLogger(__name__)


def make_backend(entry: LlmModel, triton: Triton) -> LlmBackend:
    if entry.backend == "fastertransformer":
        return FasterTransformer(triton, entry.triton_grpc_url, entry.triton_name, entry.triton_inputs)
    raise ConfigError(f"model `{entry.name}`: backend `{entry.backend}` is not available yet "
                      "(supported: fastertransformer)")


@dataclass(frozen=True)
class PromptSet:
    """A request's prompts: each one's token ids, the text `echo` sends back before its completions ("" when
    not echoing), and the request parameter that holds them (named in errors)."""

    ids: list[list[int]]
    echoes: list[str]
    param: PromptParam

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids in self.ids)


class LanguageModel(ServedModel):
    kind = LLM.kind
    entry: LlmModel

    def __init__(self, entry: LlmModel, info: ModelInfo, triton: Triton) -> None:
        super().__init__(entry, triton)
        self.tokenizer = load_tokenizer(entry.path, entry.name)
        self.template = load_chat_template(self.tokenizer, entry.chat_template, entry.name)
        self.backend = make_backend(entry, triton)
        self.policy = GenerationPolicy.of(entry, info, self.tokenizer, self.backend)
        self.decoding = TokenDecoding.of(self.tokenizer)

    def on_ready(self, triton_config: dict[str, Any]) -> None:
        self.backend.configure(triton_config)

    def card(self) -> common_pb2.ModelCard:
        card = super().card()
        card.max_model_len = self.policy.context_length
        return card

    def tokenize(self, text: str, special: bool) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def chat_prompt(self, chat: llm_pb2.Chat, chat_template_kwargs: struct_pb2.Struct) -> list[int]:
        """The messages (roles already checked by the edge) through the chat template, as token ids."""
        if self.template is None:
            raise invalid_argument(f"Model `{self.name}` has no chat template: use /v1/completions, or set "
                                   "`chat_template` in the model configuration.", "model")
        messages = [{"role": m.role, "content": m.content, **({"name": m.name} if m.name else {})}
                    for m in chat.messages]
        variables = json_format.MessageToDict(chat_template_kwargs) if chat_template_kwargs.fields else None
        return self.tokenize(self.template.render(messages, add_generation_prompt=True, variables=variables),
                             special=False)

    def prompts(self, request: llm_pb2.GenerateRequest) -> PromptSet:
        """The chat through the template, or each prompt (text or token ids) checked against the vocabulary."""
        if request.WhichOneof("input") == "chat":
            return PromptSet([self.chat_prompt(request.chat, request.chat_template_kwargs)], [""], "messages")
        prompts, echoes = [], []
        vocab = self.policy.vocab_size
        for i, prompt in enumerate(request.prompts.prompts):
            if prompt.WhichOneof("prompt") == "token_ids":
                ids = list(prompt.token_ids.ids)
                bad = next((t for t in ids if t >= vocab), None)
                if bad is not None:
                    raise invalid_argument(f"`prompt` contains token id {bad}, outside the vocabulary of "
                                           f"`{self.name}` (0..{vocab - 1}).", "prompt")
                echo = str(self.tokenizer.decode(ids)) if request.echo else ""
            else:
                ids = self.tokenize(prompt.text, special=True)
                echo = prompt.text if request.echo else ""
            if not ids:  # e.g. "" with a tokenizer that adds no special tokens
                raise invalid_argument(f"`prompt` {i} is empty." if len(request.prompts.prompts) > 1
                                       else "`prompt` is empty.", "prompt")
            prompts.append(ids)
            echoes.append(echo)
        return PromptSet(prompts, echoes, "prompt")

    async def generate(self, request: llm_pb2.GenerateRequest, timeout: float | None
                       ) -> AsyncIterator[llm_pb2.GenerateResponse]:
        """Accepted, then the deltas of all completions as they come, then the usage."""
        prompts = self.prompts(request)
        n = check_request(request, self.policy, len(prompts.ids))
        await self.ensure_ready()  # the backend's knobs are known from here on
        base, stops = sampling(request, self.policy)
        limits = [max_new_tokens(request, self.policy, len(ids), prompts.param) for ids in prompts.ids]
        seeds = choice_seeds(request, n)
        request_id = REQUEST_ID.get()  # bound from the RPC's metadata (services/common/metrics.py)
        completions, streams = [], []
        for p, ids in enumerate(prompts.ids):
            for j in range(n):
                index = p * n + j
                completion = Completion(index, ids, max_new=limits[p], stop_words=self.policy.stop_tokens, stops=stops,
                                        decoding=self.decoding, echo=prompts.echoes[p])
                completions.append(completion)
                choice = for_choice(base, limits[p], seeds[j], request_id, index)
                streams.append(self._run(completion, ids, choice, timeout))
        log.debug("%d prompt tokens, %d choices", prompts.tokens, len(completions))
        yield llm_pb2.GenerateResponse(accepted=llm_pb2.Accepted(prompt_tokens=prompts.tokens,
                                                                 choices=len(completions)))
        async for batch in merge(streams):
            for delta in coalesce(batch):
                yield llm_pb2.GenerateResponse(delta=delta)
        generated = sum(completion.consumed for completion in completions)
        yield llm_pb2.GenerateResponse(usage=common_pb2.Usage(
            prompt_tokens=prompts.tokens, completion_tokens=generated, total_tokens=prompts.tokens + generated))

    async def _run(self, completion: Completion, prompt: Sequence[int], sampling: Sampling, timeout: float | None
                   ) -> AsyncGenerator[llm_pb2.Delta, None]:
        first = completion.start()
        if first is not None:
            yield first
        if sampling.max_new_tokens > 0:
            async with contextlib.aclosing(self.backend.stream(prompt, sampling, timeout)) as steps:
                async for step in steps:
                    delta = completion.feed(step.token_ids, step.logprobs)
                    if delta is not None:
                        yield delta
                    if completion.done:
                        break  # closing the stream cancels the Triton request
        yield completion.finish()
