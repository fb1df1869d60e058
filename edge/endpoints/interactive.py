"""POST /v1/chat/interactive: LMDeploy api_server's interactive chat, on the one generation path.

Each session's conversation (`Session`) is kept in the state store that every edge process shares
(edge/state/), so a session's turns may reach any edge worker or replica: a request with
`interactive_mode: true` adds its prompt and the answer to the session, in one atomic update of the
stored session (turns in flight at once each add theirs; none is lost); one with `interactive_mode:
false` (LMDeploy's default) is answered after the session's history and then ends the session.
`cancel: true` stops the session's request in flight, wherever it runs: it leaves a flag in the store,
which the edge process running the turn looks for every CANCEL_POLL_S. The answer is LMDeploy's
`{text, tokens, input_tokens, history_tokens, finish_reason}`; streamed, one such JSON object a line,
each carrying the new text (the last line has the finish reason and the exact token counts).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Self

import orjson
from fastapi import Request, Response
from fastapi.responses import StreamingResponse
from pydantic import Field, StrictInt, field_validator, model_validator

from edge.api_router import ErrorObject
from edge.app_state import Sessions
from edge.endpoints.chat import ChatMessage
from edge.endpoints.common import UINT32_MAX, OpenAIRequest, ResponseModel
from edge.endpoints.llm_common import Collected, RepetitionPenalty, Seed, Stop, Temperature, TopK, TopP, stop_list
from edge.errors import OpenAIError, ParamError, as_openai_error
from edge.generation import GenerationInput, SamplingRequest
from edge.state import StoreUnavailable, conversation
from edge.streaming import Answer, run
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

# The generation's parameters under LMDeploy's names, for what the llm service refuses.
NAMES = {"max_tokens": "request_output_len", "messages": "prompt"}
NEW_IDS_FROM = 1 << 40  # ids for `session_id: -1` are random, above any a client is likely to pick
CANCEL_POLL_S = 0.2  # how often a turn in flight looks for a `cancel` (which may reach another process)


class InteractiveRequest(OpenAIRequest):
    """LMDeploy's GenerateRequest (what `APIClient.chat_interactive_v1` sends), and `model`, which may be
    left out when the edge serves one LLM."""

    prompt: str | list[ChatMessage]
    session_id: StrictInt = -1
    interactive_mode: bool = False
    stream: bool = False
    stop: Stop = None
    request_output_len: Annotated[int, Field(ge=0, le=UINT32_MAX)] | None = None  # 0: to end a session
    top_p: TopP | None = None
    top_k: TopK | None = None
    temperature: Temperature | None = None
    repetition_penalty: RepetitionPenalty | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool | None = True
    cancel: bool = False
    seed: Seed | None = None
    model: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: Any) -> list[str] | None:
        return None if value is None else stop_list(value)

    @model_validator(mode="after")
    def _output(self) -> Self:
        for i, message in enumerate(self.prompt if isinstance(self.prompt, list) else []):
            if message.image_urls:  # a session keeps text only
                place = f"prompt[{i}].content[{message.image_urls[0][0]}]"
                raise ParamError(f"'{place}': interactive sessions take text only, not images", place)
        if self.request_output_len == 0 and not ends_session(self):
            raise ParamError("'request_output_len' must be at least 1 (0 only to end a session).",
                             "request_output_len")
        return self

    @property
    def messages(self) -> list[llm_pb2.ChatMessage]:
        if isinstance(self.prompt, str):
            return [llm_pb2.ChatMessage(role="user", content=self.prompt)]
        return [llm_pb2.ChatMessage(role=m.role, content=m.content) for m in self.prompt]


class InteractiveResponse(ResponseModel):
    """The answer, or (streamed) one line of it."""

    text: str
    tokens: int
    input_tokens: int
    history_tokens: int
    finish_reason: Literal["stop", "length", "error"] | None
    session_id: int
    error: ErrorObject | None = None  # on the last line of a stream that failed (finish_reason "error")


# The answer, or with `stream: true` JSON lines of it (as /openapi.json declares them).
RESPONSES: dict[int | str, dict[str, Any]] = {200: {
    "model": InteractiveResponse,
    "content": {"application/x-ndjson": {"schema": {"$ref": "#/components/schemas/InteractiveResponse"}}},
    "description": "An InteractiveResponse, or with `stream: true` one InteractiveResponse a line"}}


@dataclass
class Session:
    """A session's conversation as the generation takes it, kept in the state store (edge/state/conversation.py)."""

    model: str
    messages: list[llm_pb2.ChatMessage] = field(default_factory=list)
    tokens: int = 0  # the conversation so far, as the model sees it

    def encoded(self) -> bytes:
        return conversation.encode(orjson.dumps({"model": self.model, "tokens": self.tokens}), self.messages)

    @classmethod
    def decoded(cls, value: bytes) -> Session:
        stored = conversation.decode(value)
        if stored is None:  # the older, all-JSON form: its messages text only
            fields = orjson.loads(value)
            return cls(fields["model"], [llm_pb2.ChatMessage(role=m["role"], content=m["content"])
                                         for m in fields["messages"]], fields["tokens"])
        head, messages = stored
        fields = orjson.loads(head)
        return cls(fields["model"], messages, fields["tokens"])


class TurnCancelled(Exception):
    """A streamed turn was cancelled (`cancel: true`)."""


def ends_session(body: InteractiveRequest) -> bool:
    """LMDeploy's client ends a session with an empty prompt and `interactive_mode: false`."""
    return not body.interactive_mode and body.prompt == ""


async def session_for(body: InteractiveRequest, sessions: Sessions, model: str, max_tokens: int
                      ) -> tuple[int, Session]:
    """The request's session (a new one for an unknown id or -1), within the limits; ending a session
    is always allowed."""
    session_id = NEW_IDS_FROM + secrets.randbelow(1 << 50) if body.session_id == -1 else body.session_id
    stored = await sessions.conversations.get(str(session_id))
    if ends_session(body):
        return session_id, Session.decoded(stored) if stored else Session(model)
    if stored is None:
        stored = await sessions.conversations.add(str(session_id), Session(model).encoded())
        if stored is None:
            limit = sessions.conversations.limits.max_entries
            raise OpenAIError(429, f"Too many interactive sessions (at most {limit}); end one with "
                                   "`interactive_mode: false`, or wait for idle ones to expire.", "session_id",
                              "too_many_sessions")
    session = Session.decoded(stored)
    if session.model != model:
        raise ParamError(f"Session {session_id} is a conversation with `{session.model}`, not `{model}`.", "model")
    if session.tokens >= max_tokens:
        raise ParamError(f"Session {session_id} holds {session.tokens} tokens, its budget is "
                         f"{max_tokens}: end it with `interactive_mode: false` and start another.",
                         "session_id", "session_too_long")
    return session_id, session


async def cancel(body: InteractiveRequest, sessions: Sessions) -> dict[str, Any]:
    """Stop the session's request in flight (its turn is not added to the session)."""
    if body.session_id == -1:
        raise ParamError("Set the `session_id` whose request to cancel.", "session_id")
    await sessions.cancels.put(str(body.session_id), b"cancel")
    return answer("", body.session_id)


def generation_input(body: InteractiveRequest, session: Session) -> GenerationInput:
    sampling = SamplingRequest(max_tokens=body.request_output_len, temperature=body.temperature, top_p=body.top_p,
                               top_k=body.top_k, repetition_penalty=body.repetition_penalty, ignore_eos=body.ignore_eos,
                               skip_special_tokens=body.skip_special_tokens, stop=body.stop or (), seed=body.seed)
    return GenerationInput(model=session.model, sampling=sampling, messages=[*session.messages, *body.messages],
                           stream=body.stream, names=NAMES)


def json_answer(payload: dict[str, Any]) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


def answer(text: str, session_id: int, finish_reason: str | None = "stop", tokens: int = 0, input_tokens: int = 0,
           history_tokens: int = 0) -> dict[str, Any]:
    return {"text": text, "tokens": tokens, "input_tokens": input_tokens, "history_tokens": history_tokens,
            "finish_reason": finish_reason, "session_id": session_id}


class Turn:
    """One request of a session: its answer, whole or as lines, and the session afterwards (`persist`).
    While it runs (`run`, until `close`) it watches for a `cancel`: a streamed turn stops at its next piece
    of text, any other is cancelled at once."""

    object = "interactive"
    prefix = "interactive-"

    def __init__(self, body: InteractiveRequest, session_id: int, session: Session, sessions: Sessions,
                 longest_s: float) -> None:
        self.body = body
        self.longest_s = longest_s  # the request's deadline: no watching beyond it, whatever becomes of the turn
        self.session_id = session_id
        self.key = str(session_id)
        self.session = session
        self.sessions = sessions
        self.history_tokens = session.tokens
        self.exchange: list[llm_pb2.ChatMessage] = []  # what the finished turn adds to the session
        self.added_tokens = 0
        self.cancelled = False
        self._watcher: asyncio.Task[None] | None = None

    async def run(self, request: Request, generation: GenerationInput) -> Response:
        """The turn's answer (edge/streaming.py), watched for a `cancel` while it runs: a cancelled turn
        that was not streamed answers an empty text; a streamed one stops its lines (`TurnLines`)."""
        await self.sessions.cancels.delete(self.key)  # a cancel that came before this turn is not for it
        self._watcher = asyncio.create_task(self._watch(asyncio.current_task()))
        try:
            response = await run(request, generation, Answer(self, self.lines, respond=json_lines(self),
                                                             persist=self.persist))
        except asyncio.CancelledError:
            self.close()
            task = asyncio.current_task()
            if not self.cancelled or task is None:
                raise  # the client went away
            task.uncancel()
            return json_answer(answer("", self.session_id, history_tokens=self.history_tokens))
        except BaseException:
            self.close()
            raise
        if not self.body.stream:  # a stream's lines close the turn when they end
            self.close()
        return response

    async def _watch(self, task: asyncio.Task[Any] | None) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + self.longest_s
        while loop.time() < until:
            await asyncio.sleep(CANCEL_POLL_S)
            with contextlib.suppress(StoreUnavailable):  # the turn itself reports a store that went away
                if await self.sessions.cancels.get(self.key) is not None:
                    self.cancelled = True
                    if not self.body.stream and task is not None:
                        task.cancel()
                    return

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()

    def finished(self, text: str, finish_reason: str, usage: common_pb2.Usage) -> dict[str, Any]:
        """The last answer; `persist` then adds the exchange to the session, or ends it."""
        self.exchange = [*self.body.messages, llm_pb2.ChatMessage(role="assistant", content=text)]
        self.added_tokens = usage.prompt_tokens + usage.completion_tokens - self.history_tokens
        return answer(text, self.session_id, finish_reason, usage.completion_tokens,
                      max(usage.prompt_tokens - self.history_tokens, 0), self.history_tokens)

    async def persist(self) -> None:
        if self.body.interactive_mode:
            await self.sessions.conversations.update(self.key, self._with_exchange)
        else:
            await self.sessions.conversations.delete(self.key)

    def _with_exchange(self, stored: bytes | None) -> bytes | None:
        """The stored session with this turn's exchange at its end (as it is now: another turn may have
        added its own since this one began). A session ended meanwhile stays ended."""
        if stored is None:
            return None
        session = Session.decoded(stored)
        session.messages += self.exchange
        session.tokens += self.added_tokens
        return session.encoded()

    def response(self, head: dict[str, Any], choices: list[Collected], usage: common_pb2.Usage) -> dict[str, Any]:
        return self.finished(choices[0].text, choices[0].finish_reason, usage)

    def lines(self, head: dict[str, Any]) -> TurnLines:
        return TurnLines(self)


def _line(payload: dict[str, Any]) -> bytes:
    return orjson.dumps(payload) + b"\n"


class TurnLines:
    """The streamed answer: a line per piece of text (`tokens` counts the pieces so far), then a last
    line with the finish reason and the exact counts."""

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.parts: list[str] = []
        self.finish_reason = "stop"
        self.input_tokens = 0

    def start(self, accepted: llm_pb2.Accepted) -> Iterable[bytes]:
        self.input_tokens = max(accepted.prompt_tokens - self.turn.history_tokens, 0)
        return ()

    def delta(self, delta: llm_pb2.Delta) -> Iterable[bytes]:
        if self.turn.cancelled:
            raise TurnCancelled
        self.parts.append(delta.text)
        yield _line(answer(delta.text, self.turn.session_id, None, len(self.parts), self.input_tokens,
                           self.turn.history_tokens))

    def end(self, index: int, finish_reason: str, stop_string: str = "") -> Iterable[bytes]:
        self.finish_reason = finish_reason
        return ()

    def finish(self, usage: common_pb2.Usage) -> Iterable[bytes]:
        last = self.turn.finished("".join(self.parts), self.finish_reason, usage)
        yield _line({**last, "text": ""})  # the text came line by line


async def _lines_or_error(lines: AsyncIterator[bytes], turn: Turn) -> AsyncIterator[bytes]:
    try:
        async for line in lines:
            yield line
    except TurnCancelled:
        yield _line(answer("", turn.session_id))
    except Exception as exc:  # after the status went out: the error is the last line
        error = as_openai_error(exc)
        yield _line({**answer("", turn.session_id, "error"), **error.body()})
    finally:
        turn.close()


def json_lines(turn: Turn) -> Any:
    """The `respond` of the generation path for a streamed turn: JSON lines, as LMDeploy writes them."""

    def respond(lines: AsyncIterator[bytes], keepalive_s: float) -> Response:
        return StreamingResponse(_lines_or_error(lines, turn), media_type="application/x-ndjson")

    return respond
