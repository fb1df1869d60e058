"""One LLM: prompts and chats → token ids (and text, for backends that tokenize themselves), generation on
its Triton backend (the adapter `services/llm/detect.py` picks), steps → text deltas."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2

from services.common.errors import ServiceError, invalid_argument
from services.common.metrics import Stages
from services.common.server import ServedModel
from services.common.tokenizer import load_tokenizer
from services.common.triton import Triton
from services.llm import reasoning
from services.llm.backends import Sampling, Step
from services.llm.beams import BeamSearch
from services.llm.chat import load_chat_template
from services.llm.completion import Completion, coalesce, merge
from services.llm.detect import ModelBackend
from services.llm.detokenizer import TokenDecoding
from services.llm.lora import Adapter, adapters_of
from services.llm.params import (
    GenerationPolicy,
    PromptParam,
    check_request,
    choice_seeds,
    for_choice,
    max_new_tokens,
    sampling,
)
from services.llm.toolcalls import ToolCallParser, detect_parser
from services.llm.tools import ToolPlan, plan, template_messages, tool_objects
from tritongate.common.v1 import common_pb2, tokenizer_pb2
from tritongate.config import LlmModel, ModelInfo
from tritongate.llm.v1 import llm_pb2
from tritongate.logs import REQUEST_ID
from tritongate.registry import LLM

log = logging.getLogger(__name__)
# A backend failure that names the guide: its grammar compiler rejected the schema (a client mistake).
GRAMMAR_FAILURE = re.compile(r"guided[ _]decoding|\bgrammar\b|\bjson schema\b", re.IGNORECASE)


@dataclass(frozen=True)
class PromptSet:
    """A request's prompts: each one's token ids, its text (None for a token-id prompt: decoded only for a
    backend that takes text), the text `echo` sends back before its completions ("" when not echoing), and
    the request parameter that holds them (named in errors)."""

    ids: list[list[int]]
    texts: list[str | None]
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
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def chat_prompt(self, chat: llm_pb2.Chat, chat_template_kwargs: struct_pb2.Struct) -> str:
        """The messages (roles already checked by the edge) through the chat template."""
        if self.template is None:
            raise invalid_argument(f"Model `{self.name}` has no chat template: use /v1/completions, or set "
                                   "`chat_template` in the model configuration.", "model")
        native = self.template.uses_tools
        messages = template_messages(chat, native, self.template.takes_images)
        tools = tool_objects(chat) if native and chat.tool_choice.mode != "none" else None
        variables = json_format.MessageToDict(chat_template_kwargs) if chat_template_kwargs.fields else None
        return self.template.render(messages, add_generation_prompt=True, variables=variables, tools=tools)

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
            rendered = self.chat_prompt(request.chat, request.chat_template_kwargs)
            return PromptSet([self.tokenize(rendered, special=False)], [rendered], [""], "messages")
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
                echo = str(self.tokenizer.decode(ids)) if request.echo else ""
                text: str | None = None
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

    def prompt_text(self, prompts: PromptSet, index: int) -> str:
        """Prompt `index` as text, for a backend that takes text ("" for one that takes token ids). A
        token-id prompt is decoded with its special tokens; the backend tokenizes it again."""
        if not self.backend.takes_text:
            return ""
        text = prompts.texts[index]
        return text if text is not None else str(self.tokenizer.decode(prompts.ids[index], skip_special_tokens=False))

    def completion_options(self, base: Sampling) -> dict[str, Any]:
        """What each choice's Completion takes from the model and the request's sampling."""
        return {"stop_words": self.policy.stop_tokens(base.ignore_eos), "decoding": self.decoding,
                "min_tokens": base.min_tokens, "include_stop": base.include_stop_str,
                "skip_special_tokens": base.skip_special_tokens}

    async def generate(self, request: llm_pb2.GenerateRequest, timeout: float | None
                       ) -> AsyncIterator[llm_pb2.GenerateResponse]:
        """Accepted, then the deltas of all completions as they come, then the usage; the first and the
        last with where the request's time went."""
        stages = Stages()
        with stages.tokenizing():  # the chat template too
            prompts = self.prompts(request)
        n = check_request(request, self.policy, len(prompts.ids))
        await self.ensure_ready()  # the backend and its knobs are known from here on
        base, stops = sampling(request, self.policy)
        base.images = chat_images(request, self)
        thinks = self.reasoning_family if request.HasField("chat") else None
        if thinks == "gpt_oss" and not request.HasField("skip_special_tokens") and \
                self.backend.supports("special_tokens"):
            base.skip_special_tokens = False  # the harmony markup the parser reads is special tokens
        tools = plan(request.chat, self.tool_family, self.policy) if request.HasField("chat") else ToolPlan()
        # A turn that forces a call is held to the call's grammar; the output format (`response_format`) is
        # for the answer after the tool's result, as OpenAI treats the pair (the Agents SDK sends both).
        base.guide = tools.guide or base.guide
        base.adapter = self.adapter(request.model)
        guide_param = tools.param or "response_format"
        limits = [max_new_tokens(request, self.policy, len(ids), prompts.param) for ids in prompts.ids]
        seeds = choice_seeds(request, n)
        request_id = REQUEST_ID.get()  # bound from the RPC's metadata (services/common/metrics.py)
        completions, streams = [], []
        thoughts: list[list[str]] = []  # each completion's reasoning, counted in the usage
        for p, ids in enumerate(prompts.ids):
            text = self.prompt_text(prompts, p)
            # Beam search: one backend request for the prompt, its best n beams the choices (services/llm/beams.py).
            search = BeamSearch(self.backend.stream(ids, for_choice(base, limits[p], 0, request_id, p * n), timeout,
                                                    text), n) if base.beam_width > 1 else None
            for j in range(n):
                index = p * n + j
                completion = Completion(index, ids, max_new=limits[p], stops=stops, echo=prompts.echoes[p],
                                        **self.completion_options(base))
                completions.append(completion)
                choice = for_choice(base, limits[p], seeds[j], request_id, index)
                parser = tools.parser() if tools.parser and (tools.guide or not request.HasField("guide")) else None
                reasoner = reasoning.make_parser(thinks, prompts.texts[p] or "") if thinks else None
                thoughts.append([])
                source = search.choice(j) if search else None
                streams.append(self._run(completion, ids, text, choice, timeout, parser, guide_param, source,
                                         reasoner, thoughts[-1]))
        log.debug("%d prompt tokens, %d choices", prompts.tokens, len(completions))
        yield llm_pb2.GenerateResponse(accepted=llm_pb2.Accepted(prompt_tokens=prompts.tokens,
                                                                 choices=len(completions)), timings=stages.proto())
        start = time.perf_counter()
        async for batch in merge(streams, self.entry.stream_interval_ms / 1000):
            for delta in coalesce(batch):
                yield llm_pb2.GenerateResponse(delta=delta)
        stages.inference = time.perf_counter() - start
        counted = usage(prompts, completions, n)
        counted.reasoning_tokens = sum(min(len(self.tokenize("".join(parts), special=False)), c.consumed)
                                       for parts, c in zip(thoughts, completions, strict=True) if parts)
        yield llm_pb2.GenerateResponse(usage=counted, timings=stages.proto())

    async def _run(self, completion: Completion, prompt: Sequence[int], text: str, sampling: Sampling,
                   timeout: float | None, parser: ToolCallParser | None = None, guide_param: str = "",
                   source: AsyncGenerator[Step, None] | None = None, reasoner: reasoning.ReasoningParser | None = None,
                   thoughts: list[str] | None = None) -> AsyncGenerator[llm_pb2.Delta, None]:
        """One choice's deltas. Its steps come from its own backend stream, or from `source` (a beam of a
        shared beam search). With a reasoning parser, the thinking is taken out of the text (into `reasoning`,
        and `thoughts`), then with a tool-call parser, the calls out of what is left."""
        first = completion.start()
        if first is not None:
            yield first
        if sampling.max_new_tokens > 0:
            stream = source or self.backend.stream(prompt, sampling, timeout, text)
            async with contextlib.aclosing(stream) as steps:
                try:
                    async for step in steps:
                        delta = completion.add(step)
                        if delta is not None and _parse(reasoner, parser, delta, thoughts):
                            yield delta
                        if completion.stopped:
                            break  # closing the stream cancels the Triton request
                        # At its token limit the backend ends by itself: reading on (nothing more is taken)
                        # spares Triton a cancellation racing the request's own end.
                except ServiceError as exc:
                    if sampling.guide and not completion.consumed and GRAMMAR_FAILURE.search(exc.message):
                        first_line = exc.message.strip().splitlines()[0]  # never a backend's traceback
                        raise invalid_argument(f"`{guide_param}` cannot be enforced on model `{self.name}`: the "
                                               f"backend's grammar compiler rejected it ({first_line})",
                                               guide_param) from None
                    raise
        last = completion.finish()
        _parse(reasoner, parser, last, thoughts, final=True)
        if parser is not None and parser.calls and last.finish_reason == "stop":
            last.finish_reason = "tool_calls"
        yield last


def chat_images(request: llm_pb2.GenerateRequest, model: LanguageModel) -> list[bytes]:
    """The chat's image files in order; refused when the model's backend takes no images."""
    found = [image.data for message in request.chat.messages for image in message.images]
    if found and not model.backend.supports("images"):
        raise invalid_argument(f"`messages` carry images, but model `{model.name}` does not take images (its "
                               f"{model.backend.name} backend on Triton model `{model.entry.triton_name}` declares "
                               "no image input).", "messages")
    return found


def _parse(reasoner: reasoning.ReasoningParser | None, parser: ToolCallParser | None, delta: llm_pb2.Delta,
           thoughts: list[str] | None = None, final: bool = False) -> bool:
    """Move the thinking in `delta`'s text into its `reasoning` (and `thoughts`), then the tool calls in
    what is left into its `tool_calls`; whether anything is left to send."""
    if reasoner is not None:
        thought, delta.text = reasoner.feed(delta.text)
        if final:
            more, rest = reasoner.finish()
            thought, delta.text = thought + more, delta.text + rest
        delta.reasoning = thought
        if thoughts is not None and thought:
            thoughts.append(thought)
    if parser is not None:
        content, calls = parser.feed(delta.text)
        if final:
            rest, more_calls = parser.finish()
            content, calls = content + rest, calls + more_calls
        delta.text = content
        delta.tool_calls.extend(calls)
    return bool(delta.text or delta.reasoning or delta.tool_calls or delta.logprobs or delta.finish_reason)


def usage(prompts: PromptSet, completions: list[Completion], n: int) -> common_pb2.Usage:
    """Each prompt counted once (as the backend counted it, when it says), every completion's tokens."""
    prompt_tokens = 0
    for p, ids in enumerate(prompts.ids):
        counted = [c.prompt_tokens for c in completions[p * n: (p + 1) * n] if c.prompt_tokens is not None]
        prompt_tokens += counted[0] if counted else len(ids)
    generated = sum(completion.consumed for completion in completions)
    return common_pb2.Usage(prompt_tokens=prompt_tokens, completion_tokens=generated,
                            total_tokens=prompt_tokens + generated)
