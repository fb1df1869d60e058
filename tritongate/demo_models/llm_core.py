"""The generation core every demo LLM model shares: SmolLM2-135M-Instruct in transformers, on the CPU
or a GPU (the `device` parameter, tritongate/demo_models/device.py).

The four demo LLM Triton models (`deploy/triton/smollm2-135m-instruct`, FasterTransformer's tensor
interface, and the TensorRT-LLM, TensorRT-LLM ensemble and vLLM ones in `deploy/triton-llm-backends/`)
differ only in their interface; each `model.py` parses its request into a `Sampling` and prompt token
ids, submits `Sequence`s to its `Engine` and writes the responses from an `Owner`'s callbacks.

The engine owns the weights, the batching, the sampling, beam search, the stopping rules shared by the
backends (end ids, stop words as token sequences, length) and the cancellation checks; the running batch
and its attention are in llm_batch.py, how a token is chosen (`Sampling`) in llm_sampling.py, beam search
in llm_beams.py. Each Triton model instance is its own Python-backend stub process, so each instance
loads the weights once (about 650 MB in float32, with the copies llm_linear.py reorders); nothing is
shared between models or instances.

Scheduling: one worker thread owns the model. A new sequence's prompt is prefilled on its own, in chunks
of `prefill_chunk` tokens interleaved with decoding steps, then the sequence joins the running batch
(a beam search: its `beam_width` beams): every decoding step runs the batch's rows at once, which on
this CPU model costs much less than a step per row. A sequence takes one row, a beam search one per beam;
at most `max_active` rows run, more wait in a queue.

A sequence's numbers do not depend on what it is batched with, so a greedy text is the same alone and
under load: each row's attention runs on its own keys and values, and the matrix products give a row the
same result whatever the number of rows: on the CPU the oneDNN products of llm_linear.py do, which the
engine checks when it loads; where they do not, every step computes all `max_active` rows, used or not
(llm_batch.py). (On a GPU, whose kernels may depend on more than the shapes, this is not promised.)

Logits: a sequence's prefill keeps only the last position's logits, unless the sequence asks for the
prompt's (`Sampling.context_logits`, TensorRT-LLM's `return_context_logits`); each step's are kept only
for a sequence that asks for them (`generation_logits`). Both are vocabulary-sized per position, so a model
sends them only to a request that asked.

Devices: the weights, the KV cache and every tensor fed to the model live on `Engine.device`; the
last-position logits come back to the CPU once per step, and choosing the tokens (penalties, grammar
masks, sampling with each request's seeded CPU `torch.Generator`) runs there, as on a CPU-only machine:
a seed picks the same tokens from the same logits on either device, the grammar's bitmask is applied by
xgrammar's CPU kernel, and the per-token Python work does not wait on a GPU sync for each small op.

This module runs inside Triton's Python backend, also in the official Triton image (Python 3.10, where
deploy/triton/Dockerfile copies this package): torch and transformers are imported when an Engine is
made, and triton_python_backend_utils is never imported here.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tritongate.demo_models.llm_batch import Batch, independent_of_width, row_attention
from tritongate.demo_models.llm_beams import BeamSearch
from tritongate.demo_models.llm_linear import pack_linears
from tritongate.demo_models.llm_sampling import Sampling, choose

# The weights: the folder `tritongate models fetch` writes under $TRITONGATE_MODELS_DIR.
MODEL_FOLDER = "smollm2-135m-instruct"

Log = Callable[[str], None]


class RequestError(Exception):
    """A bad request: the model reports it to the client as an error response."""


class Owner:
    """A model.py's side of one request: whether it is still wanted, and its responses.

    The engine calls these on its worker thread. A request with several sequences (n, a batch) has one
    owner for all of them.
    """

    request_id = ""  # for the log

    def aborted(self) -> str | None:
        """Why the request's sequences must end now ("cancelled", "stopped"), or None."""
        return None

    def on_token(self, seq: Sequence, reason: str | None) -> str | None:
        """`seq.tokens[-1]` was just generated; `reason` is "stop" (end id or stop word), "length" or None.
        Send what the interface sends for it and return the reason the sequence ends with (the owner may
        end it itself, e.g. on a stop string), or None to go on."""
        raise NotImplementedError

    def on_abort(self, seq: Sequence, why: str) -> None:
        """`seq` ends early: "cancelled", "stopped" (see `aborted`) or "unloading"."""

    def on_error(self, seq: Sequence, message: str) -> None:
        """Generating `seq` failed."""

    def on_beams(self, search: BeamSearch) -> None:
        """A beam search step of `search.request` (its beams: `search.best()`); the last when `search.done`."""
        raise NotImplementedError


class Sequence:
    """One generation: its prompt, how to sample, its owner and what it has produced so far."""

    def __init__(self, prompt: list[int], sampling: Sampling, owner: Owner, index: int = 0) -> None:
        self.prompt = prompt
        self.sampling = sampling
        self.owner = owner
        self.index = index  # its place among its owner's sequences
        self.tokens = list(prompt)  # the prompt, then every generated token
        self.logprobs: list[float] = []  # per generated token, when sampling.logprobs
        self.ranks: list[int] = []  # the chosen token's rank (1 = most likely), when sampling.logprobs
        self.top: list[list[tuple[int, float]]] = []  # alternatives per token, when sampling.top_logprobs
        self.context_logits: Any = None  # [prompt length, vocab] float32 on the CPU, when sampling.context_logits
        self.generation_logits: list[Any] = []  # [vocab] float32 per generated token, when sampling.generation_logits
        self.logit_chunks: list[Any] = []  # the prompt's logits while it is prefilled (context_logits)
        self.generator: Any = None  # a torch.Generator, made on the worker thread
        self.cache: Any = None  # its own KV cache while its prompt is prefilled
        self.counts: Counter[int] = Counter()  # generated tokens, for the presence/frequency penalties
        self.matcher: Any = None  # its place in sampling.grammar (guided.Matcher), made on the worker thread
        self.search: BeamSearch | None = None  # the beam search this sequence is a beam of

    def fork(self, token: int, logprob: float) -> Sequence:
        """A beam continuing this sequence with `token`, of log-probability `logprob`."""
        beam = Sequence(self.prompt, self.sampling, self.owner, self.index)
        beam.tokens, beam.logprobs = [*self.tokens, token], [*self.logprobs, logprob]
        beam.counts = self.counts + Counter([token])
        beam.search = self.search
        return beam

    @property
    def request(self) -> Sequence:
        """The sequence its owner submitted: itself, or the request a beam belongs to."""
        return self if self.search is None else self.search.request

    @property
    def rows(self) -> int:
        """The batch rows it takes: one per beam."""
        return max(self.sampling.beam_width, 1)

    @property
    def generated(self) -> int:
        return len(self.tokens) - len(self.prompt)

    def new_tokens(self) -> list[int]:
        return self.tokens[len(self.prompt):]


def model_path() -> str:
    """The converted weights, or RuntimeError naming what is missing."""
    models_dir = os.environ.get("TRITONGATE_MODELS_DIR", "")
    path = os.path.join(models_dir, MODEL_FOLDER)
    if not models_dir or not os.path.isfile(os.path.join(path, "config.json")):
        raise RuntimeError(
            f"no converted model at {path!r} (TRITONGATE_MODELS_DIR={models_dir!r}); create it with "
            "`tritongate models fetch` (tritongate.demo_models.smollm2.fetch_smollm2)"
        )
    return path


@dataclass(frozen=True)
class EngineOptions:
    """Where an engine runs and how much it runs at once."""

    device: Any = "cpu"  # a torch device or its name
    dtype: Any = "float32"  # a torch dtype or its name
    torch_threads: int = 1
    max_active: int = 4  # rows decoded together (a sequence takes one, a beam search one per beam)
    prefill_chunk: int = 256  # prompt tokens prefilled at a time, between decoding steps

    @classmethod
    def from_parameters(cls, parameters: dict[str, str], args: dict[str, Any] | None = None) -> EngineOptions:
        """From a model's config.pbtxt parameters (device, dtype, torch_threads, max_active_requests,
        prefill_chunk_tokens) and Triton's `initialize` args (a KIND_GPU instance's GPU)."""
        from tritongate.demo_models.device import placement

        device, dtype = placement(parameters, cpu_dtype="bfloat16", cuda_dtype="bfloat16", args=args)
        return cls(
            device, dtype,
            torch_threads=int(parameters.get("torch_threads") or 1),
            max_active=int(parameters.get("max_active_requests") or 4),
            prefill_chunk=int(parameters.get("prefill_chunk_tokens") or 256),
        )


def load_engine(name: str, parameters: dict[str, str], log: Log, args: dict[str, Any] | None = None) -> Engine:
    """The engine for a model, from its config.pbtxt parameters and Triton's `initialize` args
    (EngineOptions.from_parameters)."""
    return Engine(model_path(), name=name, log=log, options=EngineOptions.from_parameters(parameters, args))


class Engine:
    """The model and the worker thread that generates every submitted sequence."""

    def __init__(self, path: str, *, name: str, log: Log, options: EngineOptions) -> None:
        import torch
        from transformers import AutoModelForCausalLM, DynamicCache

        self.name, self.log = name, log
        self.torch: Any = torch
        self.cache_class: Any = DynamicCache
        self.torch_threads, self.max_active, self.prefill_chunk = (options.torch_threads, options.max_active,
                                                                   options.prefill_chunk)
        torch.set_num_threads(self.torch_threads)
        self.device = torch.device(options.device)
        dtype = getattr(torch, options.dtype) if isinstance(options.dtype, str) else options.dtype
        started = time.monotonic()
        self.model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                               attn_implementation=row_attention()).eval()
        self.model.to(self.device)
        packed = pack_linears(self.model, self.max_active)
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.model.config.eos_token_id
        self.eos_id = int(eos[0] if isinstance(eos, (list, tuple)) else eos)
        self.max_positions = int(self.model.config.max_position_embeddings)
        self.vocab_size = int(self.model.config.vocab_size)
        with torch.inference_mode():  # warm up, so that the first request is not the slow one
            self.model(input_ids=torch.tensor([[self.eos_id]], device=self.device), use_cache=False)

        from tritongate.demo_models.guided import GrammarCompiler

        self.grammars = GrammarCompiler(path, self.vocab_size)
        self.pending: queue.Queue[Sequence | None] = queue.Queue()
        self.prefilling: list[Sequence] = []  # admitted, prompt not fully processed yet
        self.batch = Batch(torch, DynamicCache, self.model.config, self.device, rows=self.max_active)
        # run only the used rows where that changes no row's numbers (llm_batch.py), checked here
        self.batch.fixed = not independent_of_width(torch, self.model, DynamicCache, self.model.config, self.device,
                                                    self.max_active)
        self.held: Sequence | None = None  # taken from the queue, waiting for free rows
        self.stopping = threading.Event()
        self.worker = threading.Thread(target=self._work, name=f"{name}-worker", daemon=True)
        self.worker.start()
        products = "oneDNN" if packed else "torch"
        rows = f"all {self.max_active} rows" if self.batch.fixed else f"the used rows (up to {self.max_active})"
        log(f"{name}: loaded {path} on {self.device} ({dtype}, {products} matrix products, each step runs {rows}, "
            f"end id {self.eos_id}) in {time.monotonic() - started:.1f} s")

    def compile_guide(self, kind: str, guide: str) -> Any:
        """A guided-decoding guide as a grammar for Sampling.grammar; RequestError when it does not compile."""
        return self.grammars.compile(kind, guide)

    def submit(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self.pending.put(seq)

    def close(self) -> None:
        """Stop the worker; every sequence still queued or running gets `on_abort(..., "unloading")`."""
        self.stopping.set()
        self.pending.put(None)  # wake the worker
        self.worker.join(timeout=30)

    # --- the worker thread ---------------------------------------------------------------------

    def _work(self) -> None:
        # OpenMP's thread count is per native thread: set it on the thread that computes.
        self.torch.set_num_threads(self.torch_threads)
        with self.torch.inference_mode():
            while not self.stopping.is_set():
                try:
                    self._admit()
                    self._drop_aborted()
                    if self.prefilling:
                        self._prefill_chunk()
                    if self.batch.used():
                        self._decode_step()
                except Exception as exc:  # never let the worker die: fail what is running
                    self._fail([seq for _, seq in self.batch.used()] + self.prefilling, exc)
                    self.batch.drop([row for row, _ in self.batch.used()])
                    self.prefilling = []
        held = [self.held] if self.held is not None else []
        for seq in _requests([seq for _, seq in self.batch.used()] + self.prefilling + held + self._drain()):
            _quietly(seq.owner.on_abort, seq, "unloading")  # unloading: end every stream

    def _admit(self) -> None:
        """Take queued sequences while their rows are free; wait for one when nothing runs."""
        while True:
            if self.held is None:
                idle = not self.batch.used() and not self.prefilling
                try:
                    seq = self.pending.get(block=idle, timeout=1.0)
                except queue.Empty:
                    return
                if seq is None or self.stopping.is_set():
                    if seq is not None:
                        self.pending.put(seq)  # ended by close()
                    return
                self.held = seq
            seq = self.held
            if self._aborted(seq):
                self.held = None
                continue
            if seq.rows > self.batch.rows:
                self.held = None
                self._fail([seq], RequestError(f"beam_width {seq.rows} exceeds the {self.batch.rows} sequences "
                                               "this model decodes together (max_active_requests)"))
                continue
            if seq.rows > self.batch.free() - sum(waiting.rows for waiting in self.prefilling):
                return  # it waits for rows to free up, ahead of the queue
            self.held = None
            seed = seq.sampling.seed
            if seed is None:
                seed = int.from_bytes(os.urandom(8), "little")
            # on the CPU, with the logits it samples from (see the module's docstring)
            seq.generator = self.torch.Generator().manual_seed(seed % (1 << 64))
            if seq.sampling.grammar is not None:
                from tritongate.demo_models.guided import Matcher

                seq.matcher = Matcher(seq.sampling.grammar, self.torch)
            seq.cache = self.cache_class(config=self.model.config)
            self.prefilling.append(seq)

    def _prefill_chunk(self) -> None:
        """Run the next `prefill_chunk` prompt tokens of the oldest new sequence, so that a long prompt
        does not stall the running streams; after its last chunk, choose its first token (or start its
        beams) and let it join the batch."""
        seq = self.prefilling[0]
        try:
            done = seq.cache.get_seq_length()
            chunk = seq.prompt[done:done + self.prefill_chunk]
            keep_all = seq.sampling.context_logits  # 0 keeps every position's logits
            out = self.model(input_ids=self.torch.tensor([chunk], device=self.device), past_key_values=seq.cache,
                             use_cache=True, logits_to_keep=0 if keep_all else 1)
            if keep_all:
                seq.logit_chunks.append(out.logits[0].float().cpu())
            if done + len(chunk) < len(seq.prompt):
                return
            self.prefilling.pop(0)
            cache, seq.cache = seq.cache, None
            if keep_all:
                seq.context_logits, seq.logit_chunks = self.torch.cat(seq.logit_chunks), []
            logits = out.logits[0, -1].float().cpu()
            if seq.sampling.beam_width > 1:
                self._start_beams(seq, logits, cache)
            elif not self._advance(seq, logits):
                self.batch.add(seq, cache)
        except Exception as exc:
            if seq in self.prefilling:
                self.prefilling.remove(seq)
            self._fail([seq], exc)

    def _start_beams(self, seq: Sequence, logits: Any, cache: Any) -> None:
        seq.search = BeamSearch(seq)
        beams = seq.search.start(self.torch, logits)
        seq.owner.on_beams(seq.search)
        if not seq.search.done:
            for beam in beams:
                self.batch.add(beam, cache)

    def _decode_step(self) -> None:
        logits = self.batch.step(self.model)
        ended: list[int] = []
        searches: dict[int, BeamSearch] = {}
        for row, seq in self.batch.used():
            if seq.search is not None:
                searches[id(seq.search)] = seq.search
                continue
            try:
                if self._advance(seq, logits[row]):
                    ended.append(row)
            except Exception as exc:
                self._fail([seq], exc)
                ended.append(row)
        for search in searches.values():
            rows = [self.batch.seqs.index(beam) for beam in search.beams]
            try:
                ended += self._step_beams(search, rows, logits)
            except Exception as exc:
                self._fail([search.request], exc)
                ended += rows
        self.batch.drop(ended)

    def _step_beams(self, search: BeamSearch, rows: list[int], logits: Any) -> list[int]:
        """One step of a beam search whose beams are in `rows`; returns the rows it no longer needs."""
        parents = search.step(self.torch, logits[rows])
        if not search.done:  # each new beam takes over the keys and values of the beam it continues
            self.batch.copy(rows, [rows[parent] for parent in parents])
            for row, beam in zip(rows, search.beams, strict=True):
                self.batch.seqs[row] = beam
        search.request.owner.on_beams(search)
        return rows if search.done else []

    def _advance(self, seq: Sequence, logits: Any) -> bool:
        """Choose `seq`'s next token and hand it to its owner; True if the sequence ended."""
        s = seq.sampling
        token = choose(self.torch, logits, seq)
        seq.tokens.append(token)
        seq.counts[token] += 1
        if seq.matcher is not None:
            seq.matcher.accept(token)
        reason = None
        stop_word = seq.generated >= s.min_tokens and _ends_with_any(seq.tokens, len(seq.prompt), s.stop_words)
        if token in s.end_ids or stop_word or (seq.matcher is not None and seq.matcher.complete):
            reason = "stop"
        elif seq.generated >= s.max_new_tokens:
            reason = "length"
        return seq.owner.on_token(seq, reason) is not None

    def _drop_aborted(self) -> None:
        self.prefilling = [seq for seq in self.prefilling if not self._aborted(seq)]
        used = self.batch.used()
        gone = {id(request) for request in _requests([seq for _, seq in used]) if self._aborted(request)}
        self.batch.drop([row for row, seq in used if id(seq.request) in gone])

    def _aborted(self, seq: Sequence) -> bool:
        why = seq.owner.aborted()
        if why is None:
            return False
        self.log(f"{self.name}: request {seq.owner.request_id!r} (sequence {seq.index}) {why} after "
                 f"{seq.generated} tokens")
        _quietly(seq.owner.on_abort, seq, why)
        return True

    def _fail(self, seqs: list[Sequence], exc: Exception) -> None:
        self.log(f"{self.name}: generation failed: {exc!r}")
        message = str(exc) if isinstance(exc, RequestError) else repr(exc)
        for seq in _requests(seqs):
            _quietly(seq.owner.on_error, seq, message)

    def _drain(self) -> list[Sequence]:
        seqs: list[Sequence] = []
        while True:
            try:
                seq = self.pending.get_nowait()
            except queue.Empty:
                return seqs
            if seq is not None:
                seqs.append(seq)


def _requests(seqs: list[Sequence]) -> list[Sequence]:
    """The requests `seqs` belong to (a beam search's beams: its request), each once, in order."""
    return list({id(seq.request): seq.request for seq in seqs}.values())


def _ends_with_any(tokens: list[int], start: int, words: list[list[int]]) -> bool:
    """Whether `tokens` ends with one of `words`, lying entirely after `start` (the generated part)."""
    return any(0 < len(word) <= len(tokens) - start and tokens[len(tokens) - len(word):] == word for word in words)


def _quietly(callback: Callable[..., Any], *args: Any) -> None:
    """Call an owner's callback; a stream that is already gone has nothing left to be told."""
    with contextlib.suppress(Exception):
        callback(*args)
