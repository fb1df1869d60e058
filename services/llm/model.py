"""One LLM: prompts and chats → token ids, generation on its Triton backend, tokens → text deltas."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

from services.common.errors import invalid_argument
from services.common.server import ServedModel
from services.common.tokenizer import load_tokenizer
from services.common.triton import Triton
from services.llm.backends import LlmBackend, Sampling
from services.llm.chat import load_chat_template
from services.llm.detokenizer import TokenText, text_decoder
from services.llm.fastertransformer import FasterTransformer
from services.llm.generation import Completion, coalesce, merge
from services.llm.params import Defaults, check_request, choice_seeds, for_choice, max_new_tokens, sampling
from tritongate.common.v1 import common_pb2
from tritongate.config import ConfigError, LlmModel, ModelInfo
from tritongate.llm.v1 import llm_pb2

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")


def make_backend(entry: LlmModel, triton: Triton) -> LlmBackend:
    if entry.backend == "fastertransformer":
        return FasterTransformer(triton, entry.triton_grpc_url, entry.triton_name, entry.triton_inputs)
    raise ConfigError(f"model `{entry.name}`: backend `{entry.backend}` is not available yet "
                      "(supported: fastertransformer)")


class LanguageModel(ServedModel):
    kind = "llm"
    entry: LlmModel

    def __init__(self, entry: LlmModel, info: ModelInfo, triton: Triton) -> None:
        super().__init__(entry, triton)
        self.tokenizer = load_tokenizer(entry.path, entry.name)
        self.vocab_size = len(self.tokenizer)
        self.template = load_chat_template(self.tokenizer, entry.chat_template, entry.name)
        self.defaults = Defaults.of(info, self.tokenizer, entry.path)
        self.backend = make_backend(entry, triton)
        self.decode = text_decoder(self.tokenizer)
        self.token_text = TokenText(self.tokenizer)

    def on_ready(self, triton_config: dict[str, Any]) -> None:
        self.backend.configure(triton_config)

    def card(self) -> common_pb2.ModelCard:
        card = super().card()
        card.max_model_len = self.defaults.max_len
        return card

    def tokenize(self, text: str, special: bool) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def chat_prompt(self, chat: llm_pb2.Chat) -> list[int]:
        if not chat.messages:
            raise invalid_argument("`messages` must not be empty.", "messages")
        for i, message in enumerate(chat.messages):
            if message.role not in ROLES:
                raise invalid_argument(f"`messages[{i}].role` is {message.role!r}; supported roles: "
                                       f"{', '.join(ROLES)}.", f"messages[{i}].role")
        if self.template is None:
            raise invalid_argument(f"Model `{self.name}` has no chat template: use /v1/completions, or set "
                                   "`chat_template` in the model configuration.", "model")
        messages = [{"role": m.role, "content": m.content, **({"name": m.name} if m.name else {})}
                    for m in chat.messages]
        return self.tokenize(self.template.render(messages, add_generation_prompt=True), special=False)

    def prompts(self, request: llm_pb2.GenerateRequest) -> tuple[list[list[int]], list[str], str]:
        """Each prompt's token ids, the text `echo` sends back, and the parameter that names the prompt."""
        if request.WhichOneof("input") == "chat":
            return [self.chat_prompt(request.chat)], [""], "messages"
        if not request.prompts.prompts:
            raise invalid_argument("`prompt` must not be empty.", "prompt")
        prompts, echoes = [], []
        for i, prompt in enumerate(request.prompts.prompts):
            if prompt.WhichOneof("prompt") == "token_ids":
                ids = list(prompt.token_ids.ids)
                bad = next((t for t in ids if t >= self.vocab_size), None)
                if bad is not None:
                    raise invalid_argument(f"`prompt` contains token id {bad}, outside the vocabulary of "
                                           f"`{self.name}` (0..{self.vocab_size - 1}).", "prompt")
                echo = str(self.tokenizer.decode(ids)) if request.echo else ""
            else:
                ids, echo = self.tokenize(prompt.text, special=True), prompt.text
            if not ids:
                raise invalid_argument(f"`prompt` {i} is empty." if len(request.prompts.prompts) > 1
                                       else "`prompt` is empty.", "prompt")
            prompts.append(ids)
            echoes.append(echo)
        return prompts, echoes, "prompt"

    async def generate(self, request: llm_pb2.GenerateRequest, timeout: float | None
                       ) -> AsyncIterator[llm_pb2.GenerateResponse]:
        """Accepted, then the deltas of all completions as they come, then the usage."""
        prompts, echoes, prompt_param = self.prompts(request)
        n = check_request(request, len(prompts), self.entry.max_choices, self.entry.max_n)
        await self.ensure_ready()
        base, stops = sampling(request, self.defaults, self.backend, self.name, self.vocab_size,
                               lambda text: self.tokenize(text, special=False))
        limits = [max_new_tokens(request, len(ids), self.defaults.max_len, prompt_param,
                                 self.entry.max_completion_tokens) for ids in prompts]
        seeds = choice_seeds(request, n)
        token_stops = [[self.defaults.end_id]] if self.defaults.end_id is not None else []
        token_stops += self.defaults.stop_words or []
        completions, streams = [], []
        for p, ids in enumerate(prompts):
            for j in range(n):
                completion = Completion(p * n + j, ids, limits[p], token_stops, stops, self.decode,
                                        self.token_text, echoes[p] if request.echo else "")
                completions.append(completion)
                choice = for_choice(base, limits[p], seeds[j], f"{request.request_id}-{p * n + j}")
                streams.append(self._run(completion, ids, choice, timeout))
        prompt_tokens = sum(len(ids) for ids in prompts)
        log.debug("%d prompt tokens, %d choices", prompt_tokens, len(completions))
        yield llm_pb2.GenerateResponse(accepted=llm_pb2.Accepted(prompt_tokens=prompt_tokens,
                                                                 choices=len(completions)))
        async for batch in merge(streams):
            for delta in coalesce(batch):
                yield llm_pb2.GenerateResponse(delta=delta)
        generated = sum(completion.consumed for completion in completions)
        yield llm_pb2.GenerateResponse(usage=common_pb2.Usage(
            prompt_tokens=prompt_tokens, completion_tokens=generated, total_tokens=prompt_tokens + generated))

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
