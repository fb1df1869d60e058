"""The shared core of the echo test models: a deterministic "generation" and the decoupled response loop.

Every echo model in this repository (ft-echo, trtllm-echo, trtllm-echo-v0, trtllm-text-echo,
trtllm-bls-echo-accumulate, vllm-echo) is one `EchoModel` subclass from an `echo_*.py` module next to
this file; the model's own `1/model.py` only imports it. The subclass owns its backend's tensor
interface (`parse` turns a request into a `Job`, `respond` builds each response); the rest is here:

- `Echo`, one sequence: generated token i repeats the prompt cyclically (sequence k of a request starts
  at prompt token k: beam k of a beam search, best first), skipping a token that would complete a bad
  word or, before `min_tokens`, an end token. It stops at an end token, when its tokens end with a stop
  word (a match may not reach into the prompt), or after `max_new` tokens. Generating nothing is
  possible: when every prompt token is skipped the sequence ends at once with "length".
- `EchoModel`, the loop: one thread per request; before each response it sleeps `delay_ms`, checks
  cancellation, then fails on purpose once `error_after_tokens` tokens exist, else generates
  `tokens_per_response` more tokens (per sequence) and sends a response (streaming) or keeps going
  (non-streaming: one response at the end, but still cancellable between chunks).
- The test knobs are optional UINT32 inputs of every echo model: `tokens_per_response` (default: the
  model parameter of that name, else 1), `delay_ms`, `error_after_tokens`.
- Events: when $TRITONGATE_TEST_EVENTS names a file, each request appends one JSON line
  {"event": "completed" | "cancelled" | "error", "model", "request_id" (Triton's), "tokens", "reason"},
  plus what the interface reports about the request (its LoRA adapter, its guide: `Job.report`).

Packaging: Triton takes every folder of a model repository for a model (a stray `__pycache__` or even a
hidden folder stops the server), while plain files are ignored. So the shared code lives in plain
`echo_*.py` files here, and each `model.py` imports them with `sys.dont_write_bytecode` set.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_events_lock = threading.Lock()
# The Python-backend stub (Triton 2.51) crashes (segfaults in the stub) when several threads send
# responses or check cancellation at the same time, e.g. 64 concurrent streams or many streams
# cancelled at once: every call into the response sender and `is_cancelled` goes through this lock.
_backend_lock = threading.Lock()


def send(sender: Any, response: Any = None, flags: int = 0) -> None:
    with _backend_lock:
        if response is None:
            sender.send(flags=flags)
        else:
            sender.send(response, flags=flags)


def is_cancelled(request: Any) -> bool:
    with _backend_lock:
        return bool(request.is_cancelled())


def event(**fields: Any) -> None:
    path = os.environ.get("TRITONGATE_TEST_EVENTS")
    if not path:
        return
    with _events_lock, open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(fields) + "\n")


class RequestError(Exception):
    """A request the backend refuses: answered with one error response (INTERNAL, as the real backends)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = pb_utils.TritonError.INTERNAL if code is None else code


# -- inputs ------------------------------------------------------------------------------------------


def tensor(request: Any, name: str) -> np.ndarray | None:
    found = pb_utils.get_input_tensor_by_name(request, name)
    return None if found is None else found.as_numpy()


def scalar(request: Any, name: str, default: Any, cast: Any) -> Any:
    """The first element of an optional input (any shape), or `default` when absent or empty."""
    values = tensor(request, name)
    if values is None or values.size == 0:
        return default
    return cast(values.reshape(-1)[0])


def strings(request: Any, name: str) -> list[str] | None:
    values = tensor(request, name)
    if values is None:
        return None
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values.reshape(-1)]


def string_tensor(name: str, texts: list[str], shape: tuple[int, ...] | None = None) -> Any:
    array = np.array([t.encode("utf-8") for t in texts], dtype=np.object_)
    return pb_utils.Tensor(name, array.reshape(shape) if shape else array)


def log_prob(position: int, beam: int = 0) -> float:
    """Generated token `position` (from 0) has log probability -0.1 * (position + 1), in every echo model;
    on beam k of a beam search 0.01 * k less, so that the beams come best first."""
    return float(np.float32(-0.1 * (position + 1) - 0.01 * beam))


# -- generation --------------------------------------------------------------------------------------


@dataclass
class Echo:
    """One generated sequence (see the module docstring); `tokens` holds every generated token, an end
    token included: whether it shows is the interface's business."""

    prompt: list[int]
    max_new: int
    end_ids: frozenset[int] = frozenset()
    min_tokens: int = 0  # no end token before this many tokens (stop words are not affected)
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    start: int = 0  # prompt position the echo starts at
    tokens: list[int] = field(default_factory=list)
    finish: str | None = None  # "length" | "end_id" | "stop_words", or what the interface sets

    def __post_init__(self) -> None:
        self._cursor = self.start

    def _banned(self, token: int) -> bool:
        if token in self.end_ids and len(self.tokens) < self.min_tokens:
            return True
        context = self.prompt + self.tokens
        return any(w[-1] == token and context[len(context) - len(w) + 1:] == w[:-1] for w in self.bad_words
                   if len(w) - 1 <= len(context))

    def _next(self) -> int | None:
        for _ in range(len(self.prompt)):
            token = self.prompt[self._cursor % len(self.prompt)]
            self._cursor += 1
            if not self._banned(token):
                return token
        return None

    def step(self) -> None:
        """Generate one token, or finish."""
        token = self._next() if len(self.tokens) < self.max_new else None
        if token is None:
            self.finish = "length"
            return
        self.tokens.append(token)
        if token in self.end_ids:
            self.finish = "end_id"
        elif any(w and len(w) <= len(self.tokens) and self.tokens[-len(w):] == w for w in self.stop_words):
            self.finish = "stop_words"
        elif len(self.tokens) >= self.max_new:
            self.finish = "length"


@dataclass
class Job:
    """One request: its sequences, whether it streams, and the test knobs."""

    request_id: str
    sequences: list[Echo]
    streaming: bool
    per_response: int = 1
    delay: float = 0.0
    error_after: int | None = None
    report: dict[str, Any] = field(default_factory=dict)  # added to the request's events (e.g. its LoRA adapter)

    @property
    def tokens(self) -> int:
        return sum(len(s.tokens) for s in self.sequences)

    @property
    def done(self) -> bool:
        return all(s.finish is not None for s in self.sequences)

    def advance(self) -> bool:
        """Up to `per_response` more tokens per sequence (all sequences in step); True when all finished."""
        for _ in range(self.per_response):
            active = [s for s in self.sequences if s.finish is None]
            if not active:
                break
            for sequence in active:
                sequence.step()
                self.after_step(sequence)
        return self.done

    def after_step(self, sequence: Echo) -> None:
        """Called after each token (vLLM checks its stop strings here)."""


# -- the model ---------------------------------------------------------------------------------------


class EchoModel:
    """The TritonPythonModel every echo model is: subclasses give `parse` and `respond`."""

    # Send FINAL as a flags-only response after the last one, as a BLS model or an ensemble does;
    # tritonclient's aio stream_infer never shows such a response, so the client sees the stream end.
    final_apart = False

    def initialize(self, args: dict[str, str]) -> None:
        self.args = args
        self.name = args["model_name"]
        self.config = json.loads(args["model_config"])
        self.params = {k: v.get("string_value", "") for k, v in self.config.get("parameters", {}).items()}
        self.inputs = {spec["name"] for spec in self.config.get("input", [])}
        self.outputs = {spec["name"] for spec in self.config.get("output", [])}
        self.lock = threading.Lock()
        self.threads: set[threading.Thread] = set()
        self.stopping = threading.Event()
        self.setup()

    def setup(self) -> None:
        """Read the model's own configuration (self.params, self.inputs, self.outputs)."""

    def param(self, key: str, default: str) -> str:
        return self.params.get(key) or default

    def knobs(self, request: Any) -> dict[str, Any]:
        """The test inputs, as `Job` keyword arguments."""
        per_response = scalar(request, "tokens_per_response", int(self.param("tokens_per_response", "1")), int)
        return {"per_response": max(1, per_response), "delay": scalar(request, "delay_ms", 0, int) / 1000.0,
                "error_after": scalar(request, "error_after_tokens", None, int)}

    def parse(self, request: Any) -> Job:
        raise NotImplementedError

    def respond(self, job: Job, done: bool) -> Any:
        """The response for what `job` generated since the last one (streaming), or for all of it."""
        raise NotImplementedError

    def error_response(self, message: str, code: int) -> Any:
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))

    def on_cancel(self, sender: Any, job: Job) -> None:
        """A cancelled request ends with an empty FINAL response (the client has gone)."""
        send(sender, flags=FINAL)

    # The loop.

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                job = self.parse(request)
            except RequestError as exc:
                self.fail(sender, str(exc), exc.code)
                continue
            thread = threading.Thread(target=self._run, args=(request, sender, job), daemon=True)
            with self.lock:
                self.threads.add(thread)
            thread.start()

    def finalize(self) -> None:
        self.stopping.set()
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=10)

    def fail(self, sender: Any, message: str, code: int | None = None) -> None:
        # pb_utils.TritonError exists only once the model runs (not while Triton imports it to auto-complete).
        self.send_last(sender, self.error_response(message, pb_utils.TritonError.INTERNAL if code is None else code))

    def send_last(self, sender: Any, response: Any) -> None:
        if self.final_apart:
            send(sender, response)
            send(sender, flags=FINAL)
        else:
            send(sender, response, FINAL)

    def event(self, kind: str, job: Job, **extra: Any) -> None:
        event(event=kind, model=self.name, request_id=job.request_id, tokens=job.tokens, **job.report, **extra)

    def _run(self, request: Any, sender: Any, job: Job) -> None:
        try:
            self._stream(request, sender, job)
        except Exception as exc:
            pb_utils.Logger.log_error(f"{self.name} failed: {exc!r}")
            with contextlib.suppress(Exception):
                self.fail(sender, repr(exc))
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())

    def _stream(self, request: Any, sender: Any, job: Job) -> None:
        while True:
            if job.delay:
                time.sleep(job.delay)
            if self.stopping.is_set() or is_cancelled(request):
                pb_utils.Logger.log_info(f"{self.name} cancelled after {job.tokens} tokens")
                self.event("cancelled", job)
                self.on_cancel(sender, job)
                return
            if job.error_after is not None and job.tokens >= job.error_after:
                self.event("error", job)
                self.fail(sender, f"{self.name}: injected error after {job.tokens} tokens")
                return
            done = job.advance()
            if done:  # the event first: a client that has seen the end finds it in the file
                reasons = [s.finish for s in job.sequences]
                self.event("completed", job, reason=reasons[0] if len(reasons) == 1 else reasons)
                self.send_last(sender, self.respond(job, True))
                return
            if job.streaming:
                send(sender, self.respond(job, False))


# -- text --------------------------------------------------------------------------------------------


class Tokenizer:
    """The demo LLM's tokenizer (tokenizer.json via `tokenizers`), for the text interfaces: they count,
    stop and decode with the same tokens as the llm service, as the real backends do with theirs."""

    def __init__(self, folder: str) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        path = Path(os.path.expandvars(folder))
        self._tokenizer = _Tokenizer.from_file(str(path / "tokenizer.json"))
        settings = json.loads((path / "tokenizer_config.json").read_text())
        self.eos_id = self._id(settings.get("eos_token"))
        self.pad_id = self._id(settings.get("pad_token")) if settings.get("pad_token") else self.eos_id
        self.vocab_size = self._tokenizer.get_vocab_size()

    def _id(self, token: Any) -> int:
        text = token.get("content") if isinstance(token, dict) else token
        found = self._tokenizer.token_to_id(text)
        if found is None:
            raise ValueError(f"the tokenizer has no token {text!r}")
        return int(found)

    def encode(self, text: str) -> list[int]:
        """Special tokens written in the text become their ids; nothing is added (SmolLM2 adds nothing
        even with add_special_tokens, so this matches vLLM's and TRT-LLM preprocessing's encoding)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))


DEMO_TOKENIZER = "${TRITONGATE_MODELS_DIR}/smollm2-135m-instruct"
