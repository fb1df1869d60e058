"""One generation request, decided once: its prompts, `n`, the sampling every choice shares, the rules
every completion is held to, its tools and reasoning, each prompt's token limit, the seeds; then one
`Choice` per completion, which runs it, and at the end the usage their counts add up to.

Choice `p * n + j` is completion `j` of prompt `p`: it samples with the request's seed + j, and under beam
search (`num_beams` > 1) it is the prompt's `j`-th best beam, all of a prompt's beams coming from one
backend request (services/llm/beams.py).

A `Choice` runs one completion: its steps through its `Completion`, then its thinking out of the text
(services/llm/reasoning.py), then its tool calls out of what is left (services/llm/toolcalls.py). Everything
about it is decided when its request is planned: its sampling, its completion's rules, its parsers, and
where its steps come from (its own backend stream, or its beam of the prompt's shared `BeamSearch`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.common.errors import ServiceError, invalid_argument
from services.llm import reasoning
from services.llm.backends import LlmBackend, Sampling, Step
from services.llm.beams import BeamSearch
from services.llm.completion import Completion, CompletionRules
from services.llm.params import PromptParam, choice_seeds, for_choice, max_new_tokens, sampling
from services.llm.reasoning import Thinking
from services.llm.toolcalls import ToolCallParser
from services.llm.tools import NO_TOOLS, ChatTools, ToolPlan
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2
from tritongate.logs import REQUEST_ID

if TYPE_CHECKING:
    from services.llm.model import LanguageModel


# A backend failure that names the guide: its grammar compiler rejected the schema, grammar or regular
# expression (a client mistake).
GRAMMAR_FAILURE = re.compile(r"guided[ _]decoding|\bgrammar\b|\bjson schema\b|\bregex\b|regular expression",
                             re.IGNORECASE)
# A backend failure that says the engine keeps no logits (a TensorRT-LLM engine built without
# gather_context_logits or gather_generation_logits, although its Triton model declares the outputs): the
# request asked for log probabilities this deployment cannot give.
LOGITS_FAILURE = re.compile(r"gather_(context|generation)_logits")


@dataclass
class Choice:
    """One choice: its completion, its sampling (its own seed, token limit and Triton request id), where its
    steps come from, its parsers (None: not parsed), and what a grammar compiler's refusal names."""

    completion: Completion
    sampling: Sampling
    steps: AsyncGenerator[Step, None]  # its own backend stream, or its beam of a shared beam search
    calls: ToolCallParser | None
    thinking: Thinking | None
    guide_param: str  # the request parameter the guide came from
    model: str

    async def deltas(self) -> AsyncGenerator[llm_pb2.Delta, None]:
        """The choice's deltas: the echo if any, then what each step brings, then the last with the finish
        reason. Closing it closes its steps (a backend stream's close cancels the Triton request); a choice
        that may generate nothing (`max_tokens` 0 with `echo`) never starts them."""
        completion = self.completion
        first = completion.start()
        if first is not None:
            yield first
        if self.sampling.max_new_tokens > 0:
            async with contextlib.aclosing(self.steps) as steps:
                try:
                    async for step in steps:
                        delta = completion.add(step)
                        if delta is None:
                            if self.thinking is not None:  # tokens that make no text yet count all the same
                                self.thinking.split("", completion.released)
                        elif self._parse(delta):
                            yield delta
                        if completion.stopped:
                            break  # closing the stream cancels the Triton request
                        # At its token limit the backend ends by itself: reading on (nothing more is taken)
                        # spares Triton a cancellation racing the request's own end.
                except ServiceError as exc:
                    refusal = self._refusal(exc)
                    if refusal is None:
                        raise
                    raise refusal from None
        last = completion.finish()
        self._parse(last, final=True)
        if self.calls is not None and self.calls.calls and last.finish_reason == "stop":
            last.finish_reason = "tool_calls"
        yield last

    def _parse(self, delta: llm_pb2.Delta, final: bool = False) -> bool:
        """Move the thinking in `delta`'s text into its `reasoning`, then the tool calls in what is left into
        its `tool_calls`; whether anything is left to send."""
        if self.thinking is not None:
            delta.reasoning, delta.text = self.thinking.split(delta.text, self.completion.released, final)
        if self.calls is not None:
            content, calls = self.calls.feed(delta.text)
            if final:
                rest, more_calls = self.calls.finish()
                content, calls = content + rest, calls + more_calls
            delta.text = content
            delta.tool_calls.extend(calls)
        return bool(delta.text or delta.reasoning or delta.tool_calls or delta.logprobs or delta.finish_reason)

    def _refusal(self, exc: ServiceError) -> ServiceError | None:
        """The client's mistake a backend failure shows before anything was generated: the backend's grammar
        compiler rejected the guide, or its engine keeps no logits for the log probabilities asked for (None:
        the failure is the backend's)."""
        if self.completion.consumed:
            return None
        first_line = exc.message.strip().splitlines()[0] if exc.message.strip() else ""  # never a traceback
        if self.sampling.guide is not None and GRAMMAR_FAILURE.search(exc.message):
            return invalid_argument(f"`{self.guide_param}` cannot be enforced on model `{self.model}`: the "
                                    f"backend's grammar compiler rejected it ({first_line})", self.guide_param)
        logits = LOGITS_FAILURE.search(exc.message)
        if logits is not None and (self.sampling.prompt_logprobs or self.sampling.top_logprobs):
            param, what = ("echo", "the prompt's log probabilities") if logits.group(1) == "context" else \
                ("logprobs", "alternatives per token")
            return invalid_argument(f"`{param}`: model `{self.model}` cannot return {what}; its engine keeps no "
                                    f"{logits.group(1)} logits ({first_line})", param)
        return None


@dataclass(frozen=True)
class PromptSet:
    """A request's prompts: each one's token ids, its text (None for a token-id prompt not echoed: decoded
    only for a backend that takes text), the text `echo` sends back before its completions ("" when not
    echoing), the request parameter that holds them (named in errors), and a chat's tools, parsed once."""

    ids: list[list[int]]
    texts: list[str | None]
    echoes: list[str]
    param: PromptParam
    tools: ChatTools = NO_TOOLS

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids in self.ids)


@dataclass(frozen=True)
class RequestPlan:
    """Everything one generation request decides before its choices run."""

    model: str  # the public id, named in messages
    prompts: PromptSet
    backend_texts: list[str]  # each prompt as a backend that takes text gets it ("" for one that takes ids)
    n: int  # completions per prompt
    base: Sampling  # what every choice samples with, but its token limit, seed and request id
    rules: CompletionRules
    limits: list[int]  # each prompt's max_new_tokens
    seeds: list[int]  # the seed of each prompt's completion j
    calls: Callable[[], ToolCallParser] | None  # a choice's tool-call parser; None: the text is not parsed
    thinks: reasoning.ReasoningName | None  # the family whose parser takes each choice's thinking out
    guide_param: str  # the parameter the guide came from, named when a backend cannot compile it
    request_id: str  # the client's, bound from the RPC's metadata (services/common/metrics.py)

    @classmethod
    def of(cls, model: LanguageModel, request: llm_pb2.GenerateRequest, prompts: PromptSet, n: int) -> RequestPlan:
        """The plan of `request` (its `prompts` and `n` already checked) on `model`, once its backend is known;
        a knob, format or tool choice the backend cannot honour, images it does not take and a prompt that
        leaves no room in the context are refused here."""
        policy = model.policy
        base, stops = sampling(request, policy)
        base.images = _images(request, model)
        thinks = model.reasoning_family if request.HasField("chat") else None
        if thinks == "gpt_oss" and not request.HasField("skip_special_tokens") and \
                model.backend.supports("special_tokens"):
            base.skip_special_tokens = False  # the harmony markup the parser reads is special tokens
        tools = ToolPlan.of(request.chat, prompts.tools, model.tool_family, policy) if request.HasField("chat") \
            else ToolPlan()
        # A turn that forces a call is held to the call's grammar (a custom tool's may have none); the output
        # format (`response_format`) is for the answer after the tool's result, as OpenAI treats the pair (the
        # Agents SDK sends both).
        base.guide = tools.guide if tools.forced else base.guide
        base.adapter = model.adapter(request.model)
        rules = CompletionRules(policy.stop_tokens(base.ignore_eos), stops, model.decoding, base.min_tokens,
                                base.include_stop_str, base.skip_special_tokens)
        if base.prompt_logprobs and not model.backend.takes_text and model.backend.supports("ignore_eos"):
            # A scored text keeps every generated token's entry, the end id's too (services/llm/completion.py):
            # the service, not TensorRT-LLM, which leaves the end id out of its output, stops at the end id.
            base.ignore_eos = True
        limits = [max_new_tokens(request, policy, len(ids), prompts.param) for ids in prompts.ids]
        # Calls are parsed unless a format the request asked for (and no forced call) shapes the text.
        calls = tools.parser if tools.forced or not request.HasField("guide") else None
        return cls(model.name, prompts, [_backend_text(model, prompts, p) for p in range(len(prompts.ids))], n,
                   base, rules, limits, choice_seeds(request, n), calls, thinks, tools.param or "response_format",
                   REQUEST_ID.get())

    def choices(self, backend: LlmBackend, timeout: float | None) -> list[Choice]:
        """One choice per completion, each with its own backend stream, or with beam search its beam of its
        prompt's one backend request."""
        choices = []
        n = self.n
        for p, ids in enumerate(self.prompts.ids):
            limit, text = self.limits[p], self.backend_texts[p]
            search = BeamSearch(backend.stream(ids, for_choice(self.base, limit, 0, self.request_id, p * n), timeout,
                                               text), n) if self.base.beam_width > 1 else None
            # The prompt's log probabilities come with the first generated token: `max_tokens` 0 generates one,
            # which the completion drops.
            backend_limit = max(limit, 1) if self.base.prompt_logprobs else limit
            for j in range(n):
                index = p * n + j
                own = for_choice(self.base, backend_limit, self.seeds[j], self.request_id, index)
                completion = Completion(index, ids, self.rules, max_new=limit, echo=self.prompts.echoes[p],
                                        prompt_logprobs=self.base.prompt_logprobs)
                parser = reasoning.make_parser(self.thinks, self.prompts.texts[p] or "") if self.thinks else None
                choices.append(Choice(completion, own,
                                      search.choice(j) if search else backend.stream(ids, own, timeout, text),
                                      self.calls() if self.calls else None,
                                      reasoning.Thinking(parser, self.rules.decoding.count) if parser else None,
                                      self.guide_param, self.model))
        return choices

    def usage(self, choices: list[Choice]) -> common_pb2.Usage:
        """Each prompt counted once (as the backend counted it, when it says), with the tokens of it the
        backend took from its cache (as its first choice that says reports them); every completion's tokens,
        and the thinking's."""
        n, prompt_tokens, cached_tokens = self.n, 0, 0
        for p, ids in enumerate(self.prompts.ids):
            own = [c.completion for c in choices[p * n: (p + 1) * n]]
            counted = next((c.prompt_tokens for c in own if c.prompt_tokens is not None), len(ids))
            prompt_tokens += counted
            cached_tokens += min(next((c.cached_tokens for c in own if c.cached_tokens is not None), 0), counted)
        generated = sum(choice.completion.consumed for choice in choices)
        thinking = sum(c.thinking.used(c.completion.consumed) for c in choices if c.thinking is not None)
        return common_pb2.Usage(prompt_tokens=prompt_tokens, completion_tokens=generated,
                                total_tokens=prompt_tokens + generated, reasoning_tokens=thinking,
                                cached_tokens=cached_tokens)


def _backend_text(model: LanguageModel, prompts: PromptSet, index: int) -> str:
    """Prompt `index` as text, for a backend that takes text ("" for one that takes token ids). A token-id
    prompt not decoded yet (for its echo) is decoded with its special tokens; the backend tokenizes it again."""
    if not model.backend.takes_text:
        return ""
    text = prompts.texts[index]
    return text if text is not None else str(model.tokenizer.decode(prompts.ids[index], skip_special_tokens=False))


def _images(request: llm_pb2.GenerateRequest, model: LanguageModel) -> list[bytes]:
    """The chat's image files in order; refused when the model's backend takes no images."""
    found = [image.data for message in request.chat.messages for image in message.images]
    if found and not model.backend.supports("images"):
        raise invalid_argument(f"`messages` carry images, but model `{model.name}` does not take images (its "
                               f"{model.backend.name} backend on Triton model `{model.entry.triton_name}` declares "
                               "no image input).", "messages")
    return found
