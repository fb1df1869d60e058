"""One LLM: prompts and chats → token ids (and text, for backends that tokenize themselves); a generation
planned once (services/llm/plan.py), each of its completions run by a `Choice` (the same module) on
the Triton backend the adapter `services/llm/detect.py` picks, and their deltas merged."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2

from services.common.errors import ServiceError, invalid_argument
from services.common.metrics import Stages
from services.common.prefix_routing import ROUTE, Route
from services.common.server import ServedModel
from services.common.tokenizer import PrefixCache, load_tokenizer
from services.common.triton import Triton
from services.llm import reasoning
from services.llm.chat import load_chat_template
from services.llm.completion import coalesce, merge
from services.llm.detect import ModelBackend
from services.llm.detokenizer import TokenDecoding
from services.llm.lora import Adapter, adapters_of
from services.llm.params import GenerationPolicy, check_request
from services.llm.plan import PromptSet, RequestPlan
from services.llm.toolcalls import detect_parser
from services.llm.tools import NO_TOOLS, ChatTools, template_messages
from tritongate.common.v1 import common_pb2, tokenizer_pb2
from tritongate.config import LlmModel, ModelInfo
from tritongate.llm.v1 import llm_pb2
from tritongate.registry import LLM

log = logging.getLogger(__name__)


class LanguageModel(ServedModel):
    kind = LLM.kind
    entry: LlmModel

    def __init__(self, entry: LlmModel, info: ModelInfo, triton: Triton) -> None:
        super().__init__(entry, triton)
        self.tokenizer = load_tokenizer(entry.path, entry.name)
        self.prefixes = PrefixCache(self.tokenizer)  # a conversation's next turn tokenizes only what is new
        self.template = load_chat_template(self.tokenizer, entry.chat_template, entry.name)
        self.backend = ModelBackend(entry, triton, self.triton_pool)
        self.policy = GenerationPolicy.of(entry, info, self.tokenizer, self.backend)
        self.decoding = TokenDecoding.of(self.tokenizer)
        self.refusal: str | None = None  # why the Triton model cannot be served, while it cannot
        self.tool_family = entry.tool_parser or detect_parser(self.template.source if self.template else "")
        self.adapters = adapters_of(entry)  # by every model id that names one
        self.reasoning_family: reasoning.ReasoningName | None = None if entry.reasoning_parser == "none" else \
            entry.reasoning_parser or reasoning.detect_parser(self.template.source if self.template else "")

    def on_ready(self, triton_config: dict[str, Any]) -> None:
        """Pick and configure the backend adapter; FAILED_PRECONDITION when none can drive the model."""
        self.backend.configure(triton_config)
        self.policy.check_backend()
        log.info("model %s: %s backend", self.name, self.backend.name)

    async def refresh(self) -> bool:
        """As every model; a Triton model no adapter can drive is not ready, and why is logged at ERROR
        (once per reason) so that `tritongate up` shows it, and told to requests."""
        try:
            ready = await super().refresh()
        except ServiceError as exc:
            if exc.code != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            if exc.message != self.refusal:
                log.error("model %s cannot be served: %s", self.name, exc.message)
            self.refusal = exc.message
            return False
        self.refusal = None
        return ready

    async def ensure_ready(self) -> None:
        try:
            await super().ensure_ready()
        except ServiceError:
            if self.refusal:
                raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                                   f"model `{self.name}` cannot be served: {self.refusal}") from None
            raise

    def card(self) -> common_pb2.ModelCard:
        card = super().card()
        card.max_model_len = self.policy.context_length
        card.image_input = self.backend.supports("images")
        card.max_beams = max(self.backend.beam_widths, default=0)
        card.reasoning = self.reasoning_family is not None
        return card

    def cards(self) -> list[common_pb2.ModelCard]:
        base = self.card()
        cards = [base]
        for model_id in self.adapters:
            card = common_pb2.ModelCard()
            card.CopyFrom(base)  # everything but the id and the parent is the base model's
            card.id, card.parent = model_id, self.name
            cards.append(card)
        return cards

    def adapter(self, model_id: str) -> Adapter | None:
        """The LoRA adapter `model_id` names (None: the model itself), if its backend can run adapters."""
        adapter = self.adapters.get(model_id)
        if adapter is not None and not self.backend.supports("lora"):
            raise invalid_argument(f"`{model_id}` is a LoRA adapter of model `{self.name}`, whose "
                                   f"{self.backend.name} backend cannot run LoRA adapters.", "model")
        return adapter

    def tokenize(self, text: str, special: bool) -> list[int]:
        if not special:  # a rendered chat: most of it often the previous turn's
            return self.prefixes.encode(text)
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def chat_prompt(self, chat: llm_pb2.Chat, chat_template_kwargs: struct_pb2.Struct, tools: ChatTools = NO_TOOLS
                    ) -> str:
        """The messages (roles already checked by the edge) and `tools` (the chat's) through the chat template."""
        if self.template is None:
            raise invalid_argument(f"Model `{self.name}` has no chat template: use /v1/completions, or set "
                                   "`chat_template` in the model configuration.", "model")
        native = self.template.uses_tools
        messages = template_messages(chat, native, self.template.takes_images, tools)
        variables = json_format.MessageToDict(chat_template_kwargs) if chat_template_kwargs.fields else None
        return self.template.render(messages, add_generation_prompt=True, variables=variables,
                                    tools=tools.objects if native else None)

    def chat_tokens(self, chat: tokenizer_pb2.TokenizerChat) -> list[int]:
        """The prompt a chat becomes (the TokenizerService), as Generate tokenizes it."""
        messages = [llm_pb2.ChatMessage(role=m.role, content=m.content) for m in chat.messages]
        return self.tokenize(self.chat_prompt(llm_pb2.Chat(messages=messages), struct_pb2.Struct()), special=False)

    def generation_tokens(self, request: llm_pb2.GenerateRequest) -> list[int]:
        """The prompt tokens a generation input becomes, as Generate tokenizes it (all its prompts')."""
        return [token for ids in self.prompts(request).ids for token in ids]

    def prompts(self, request: llm_pb2.GenerateRequest) -> PromptSet:
        """The chat through the template, or each prompt (text or token ids) checked against the vocabulary."""
        if request.WhichOneof("input") == "chat":
            tools = ChatTools.of(request.chat)
            rendered = self.chat_prompt(request.chat, request.chat_template_kwargs, tools)
            return PromptSet([self.tokenize(rendered, special=False)], [rendered], [""], "messages", tools)
        prompts: list[list[int]] = []
        texts: list[str | None] = []
        echoes: list[str] = []
        vocab = self.policy.vocab_size
        for i, prompt in enumerate(request.prompts.prompts):
            if prompt.WhichOneof("prompt") == "token_ids":
                ids = list(prompt.token_ids.ids)
                bad = next((t for t in ids if t >= vocab), None)
                if bad is not None:
                    raise invalid_argument(f"`prompt` contains token id {bad}, outside the vocabulary of "
                                           f"`{self.name}` (0..{vocab - 1}).", "prompt")
                # Decoded once, for the echo (and the prompt for a backend that takes text, services/llm/plan.py).
                text: str | None = str(self.tokenizer.decode(ids)) if request.echo else None
                echo = text or ""
            else:
                ids = self.tokenize(prompt.text, special=True)
                echo = prompt.text if request.echo else ""
                text = prompt.text
            if not ids:  # e.g. "" with a tokenizer that adds no special tokens
                raise invalid_argument(f"`prompt` {i} is empty." if len(request.prompts.prompts) > 1
                                       else "`prompt` is empty.", "prompt")
            prompts.append(ids)
            texts.append(text)
            echoes.append(echo)
        return PromptSet(prompts, texts, echoes, "prompt")

    async def generate(self, request: llm_pb2.GenerateRequest, timeout: float | None
                       ) -> AsyncIterator[llm_pb2.GenerateResponse]:
        """Accepted, then the deltas of all completions as they come, then the usage; the first and the
        last with where the request's time went."""
        stages = Stages()
        with stages.tokenizing():  # the chat template too
            prompts = self.prompts(request)
        n = check_request(request, self.policy, len(prompts.ids))
        await self.ensure_ready()  # the backend and its knobs are known from here on
        plan = RequestPlan.of(self, request, prompts, n)
        route = Route(prompts.ids[0], conversation_key(request), request.cache_salt)
        ROUTE.set(route)  # for this generation's Triton calls: its task's, and those of the tasks it starts
        choices = plan.choices(self.backend, timeout)
        log.debug("%d prompt tokens, %d choices", prompts.tokens, len(choices))
        yield llm_pb2.GenerateResponse(accepted=llm_pb2.Accepted(prompt_tokens=prompts.tokens, choices=len(choices)),
                                       timings=stages.proto())
        start = time.perf_counter()
        async for batch in merge([choice.deltas() for choice in choices], self.entry.stream_interval_ms / 1000):
            for delta in coalesce(batch):
                yield llm_pb2.GenerateResponse(delta=delta)
        stages.inference = time.perf_counter() - start
        usage = plan.usage(choices)
        self.triton_pool.count_usage(route, usage.prompt_tokens, usage.cached_tokens)
        yield llm_pb2.GenerateResponse(usage=usage, timings=stages.proto())


def conversation_key(request: llm_pb2.GenerateRequest) -> bytes | None:
    """What names the request's conversation for the choice of Triton endpoint: the client's key, else a
    chat's start (its messages up to its first user message, which every later turn repeats, and which
    tells apart conversations that share a long system prompt); None for prompts without a key."""
    if request.affinity_key or request.WhichOneof("input") != "chat":
        return request.affinity_key or None
    start = hashlib.blake2b(b"chat", digest_size=16)
    for message in request.chat.messages:
        start.update(message.SerializeToString(deterministic=True))
        if message.role == "user":
            break
    return start.digest()
