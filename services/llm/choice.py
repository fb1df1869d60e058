"""One choice of a generation, run: its steps through its `Completion`, then its thinking out of the text
(services/llm/reasoning.py), then its tool calls out of what is left (services/llm/toolcalls.py).

Everything about a choice is decided when its request is planned (services/llm/plan.py): its sampling,
its completion's rules, its parsers, and where its steps come from (its own backend stream, or its beam
of the prompt's shared `BeamSearch`). A `Choice` only runs it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from services.common.errors import ServiceError, invalid_argument
from services.llm.backends import Sampling, Step
from services.llm.completion import Completion
from services.llm.reasoning import Thinking
from services.llm.toolcalls import ToolCallParser
from tritongate.llm.v1 import llm_pb2

# A backend failure that names the guide: its grammar compiler rejected the schema, grammar or regular
# expression (a client mistake).
GRAMMAR_FAILURE = re.compile(r"guided[ _]decoding|\bgrammar\b|\bjson schema\b|\bregex\b|regular expression",
                             re.IGNORECASE)


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
        """The client's mistake a backend failure shows when the backend's grammar compiler rejected the guide
        before anything was generated (None: the failure is the backend's)."""
        if self.sampling.guide is not None and not self.completion.consumed and GRAMMAR_FAILURE.search(exc.message):
            first_line = exc.message.strip().splitlines()[0]  # never a backend's traceback
            return invalid_argument(f"`{self.guide_param}` cannot be enforced on model `{self.model}`: the "
                                    f"backend's grammar compiler rejected it ({first_line})", self.guide_param)
        return None
