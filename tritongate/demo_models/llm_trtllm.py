"""The request semantics of TensorRT-LLM's C++ `tensorrt_llm` model (tensorrtllm_backend, now
NVIDIA/TensorRT-LLM `triton_backend/inflight_batcher_llm/src`), on the shared demo engine.

Both TensorRT-LLM demo models use it: `smollm2-135m-instruct-trtllm` (the tensor interface) directly, and
`smollm2-135m-instruct-trtllm-ensemble` behind its own preprocessing (text → these tensors) and
postprocessing (output ids → text), as the real ensemble runs the `tensorrt_llm` model between its
`preprocessing` and `postprocessing` models. What the C++ backend does, and so what this does:

- A request with batch size b > 1 becomes b generations (input_ids[i, :input_lengths[i]]); with b = 1
  the whole `input_ids` row is the prompt and `input_lengths` is not read. `num_return_sequences` n
  multiplies them. Each generation answers on its own, with `batch_index` (only when b > 1) and
  `sequence_index` (only when n > 1); only the last one to end carries TRITONSERVER_RESPONSE_COMPLETE_FINAL.
- `streaming`: each response holds only the new tokens (`output_ids` [1, 1, new], `sequence_length`
  [1, 1] = new); the prompt never. Otherwise one response per generation: prompt + completion, or the
  completion alone with `exclude_input_in_output` (request input, else the model parameter).
- `end_id` unset means -1: no end id, generation runs to `request_output_len`. A generated end id ends
  the generation and is not in the output (so the last streamed response may hold no token); stop words
  stay in the output.
- `stop_words_list` / `bad_words_list`: [b, 2, N] (ids, then cumulative end offsets padded with -1),
  validated as `convertWordList` does; a malformed list fails the request.
- `return_log_probs`: `output_log_probs` [1, 1, tokens in this response] and `cum_log_probs` [1, 1].
  `return_num_input_tokens` / `return_num_output_tokens`: [1, 1] INT32, the latter counting every id in
  this response's `output_ids` (the prompt too, when it is there).
- `return_context_logits`: `context_logits` [1, prompt length, vocab] FP32 in a generation's first response
  (the logits at each prompt position: row i scores the token after prompt token i);
  `return_generation_logits`: `generation_logits` [1, 1, tokens in this response, vocab] FP32, the model's
  logits before any sampling rule. (The real engine returns context logits only when built with
  `gather_context_logits`; the demo always can.)
- Sampling: greedy unless `runtime_top_k` > 1 or `runtime_top_p` > 0 (with `temperature` > 0); the seed
  defaults to 0. `early_stopping`, `beam_search_diversity_rate`, `pad_id` and the `runtime_top_p_*` decay
  inputs are accepted and ignored.
- Beam search: `beam_width` up to the model's `max_beam_width`, scored with `len_penalty` (default 0: the
  cumulative log-probability; llm_beams.py). A batch item returns `num_return_sequences` beams (at most
  `beam_width`; all of them when unset) in one response per step: `output_ids` [1, beams, longest] (shorter
  beams padded with -1) and `sequence_length` [1, beams]. Streamed, each response holds every beam's
  generated tokens so far (beam search may rewrite them), as TensorRT-LLM's returnAllGeneratedTokens does;
  otherwise one response at the end, with the prompt unless `exclude_input_in_output`. The end id that
  ended a beam is not in its output.
- Cancellation (the client went away) and `stop` (a second request with the same request id and
  `stop` = true) end the generations; each ends with a last response, empty when streaming. Errors come
  back as one error response, as the backend's INTERNAL errors do.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from tritongate.demo_models.llm_beams import BeamSearch, beam_arrays
from tritongate.demo_models.llm_core import Owner, RequestError, Sequence
from tritongate.demo_models.llm_sampling import Sampling

Get = Callable[[str], Any]  # a request's input tensor by name, as numpy, or None


def _assert(condition: bool, message: str) -> None:
    if not condition:  # the shape of TLLM_CHECK_WITH_INFO's message
        raise RequestError(f"[TensorRT-LLM][ERROR] Assertion failed: {message}")


def refusal(message: str) -> str:
    """A refused request's error message in the words of TensorRT-LLM's checks, "[TensorRT-LLM][ERROR] ...",
    by which the llm service tells a refusal inside a stream (where Triton sends no error code)."""
    prefix = "[TensorRT-LLM][ERROR] "
    return message if message.startswith(prefix) else prefix + message


def word_list(flat: list[int]) -> list[list[int]]:
    """One batch item's [2, N] word list, flattened, as words (utils.cc `convertWordList`)."""
    listed = " ".join(str(v) for v in flat) + " "
    n = len(flat)
    _assert(n % 2 == 0, f"Sparse list must not have odd length: {listed}")
    tokens, words, current = n // 2, [], 0
    for i in range(tokens, n):
        if flat[i] == -1:
            _assert(all(v == -1 for v in flat[i + 1:]), f"Sparse list must not have additional -1s: {listed}")
            break
        _assert(flat[i] <= tokens, f"Sparse list must not have out-of-bound offsets: {listed}")
        if i != tokens:
            _assert(flat[i] > flat[i - 1], f"Sparse list must not have non-increasing offsets: {listed}")
        words.append(list(flat[current:flat[i]]))
        current = max(current, flat[i])
    return [word for word in words if word]


class Inputs:
    """A request's tensors, read per batch item as the C++ backend slices them."""

    def __init__(self, get: Get, batch_size: int) -> None:
        self.get, self.batch_size = get, batch_size

    def row(self, name: str, item: int) -> np.ndarray | None:
        value = self.get(name)
        if value is None:
            return None
        array = np.asarray(value)
        if array.ndim == 0:
            return array.reshape(1)
        return np.asarray(array[min(item, array.shape[0] - 1)]).reshape(-1)

    def scalar(self, name: str, item: int, default: Any, cast: Callable[[Any], Any]) -> Any:
        row = self.row(name, item)
        return default if row is None or row.size == 0 else cast(row[0])


@dataclasses.dataclass
class Item:
    """One batch item of a request: its prompt, how to sample it and how to answer."""

    prompt: list[int]
    sampling: Sampling
    num_return_sequences: int
    exclude_input: bool


def parse_items(inputs: Inputs, prompts: list[list[int]], *, end_id: int | None, exclude_input: bool,
                vocab_size: int, max_positions: int, compile_guide: Callable[[str, str], Any] | None = None,
                max_beam_width: int = 1) -> list[Item]:
    """The request's batch items. `end_id` is the default end id (None: -1, no end id); `compile_guide`
    makes a guided-decoding guide a grammar; `max_beam_width` is the model's parameter."""
    items = []
    for i, prompt in enumerate(prompts):
        max_new = inputs.scalar("request_output_len", i, None, int)
        if max_new is None:
            raise RequestError("request_output_len is not present in the request")
        if max_new <= 0:
            raise RequestError(f"request_output_len must be greater than 0, got {max_new}")
        if not prompt:
            raise RequestError("the prompt (input_ids) is empty")
        if len(prompt) + max_new > max_positions:
            raise RequestError(f"prompt length ({len(prompt)}) + request_output_len ({max_new}) exceeds the "
                               f"maximum sequence length ({max_positions})")
        if inputs.scalar("return_perf_metrics", i, False, bool):
            raise RequestError("return_perf_metrics: not supported by this demo model")
        beam_width = inputs.scalar("beam_width", i, 1, int)
        if not 1 <= beam_width <= max_beam_width:
            raise RequestError(f"beam_width={beam_width}: this model's max_beam_width is {max_beam_width}")
        count = inputs.scalar("num_return_sequences", i, beam_width, int)
        if count < 1 or (beam_width > 1 and count > beam_width):
            raise RequestError(f"num_return_sequences must be at least 1 (and at most beam_width with beam "
                               f"search), got {count}")
        top_k = inputs.scalar("runtime_top_k", i, 0, int)
        top_p = inputs.scalar("runtime_top_p", i, 0.0, float)
        temperature = inputs.scalar("temperature", i, 1.0, float)
        end = inputs.scalar("end_id", i, end_id, int)
        sampling = Sampling(
            max_new_tokens=max_new,
            greedy=temperature <= 0.0 or top_k == 1 or (top_k <= 0 and top_p <= 0.0),
            temperature=temperature, top_k=max(top_k, 0), top_p=top_p if 0.0 < top_p < 1.0 else 1.0,
            seed=inputs.scalar("seed", i, 0, int),
            repetition_penalty=inputs.scalar("repetition_penalty", i, 1.0, float),
            presence_penalty=inputs.scalar("presence_penalty", i, 0.0, float),
            frequency_penalty=inputs.scalar("frequency_penalty", i, 0.0, float),
            min_tokens=inputs.scalar("min_tokens", i, 0, int),
            end_ids=(end,) if end is not None and end >= 0 else (),
            stop_words=_words(inputs, "stop_words_list", i), bad_words=_words(inputs, "bad_words_list", i),
            bias=_bias(inputs, i, vocab_size), logprobs=inputs.scalar("return_log_probs", i, False, bool),
            grammar=_grammar(inputs, i, compile_guide),
            beam_width=beam_width, length_penalty=inputs.scalar("len_penalty", i, 0.0, float),
            context_logits=inputs.scalar("return_context_logits", i, False, bool),
            generation_logits=inputs.scalar("return_generation_logits", i, False, bool),
        )
        if beam_width > 1 and sampling.grammar is not None:
            raise RequestError("guided decoding cannot be combined with beam search (beam_width > 1)")
        if beam_width > 1 and (sampling.context_logits or sampling.generation_logits):
            raise RequestError("return_context_logits and return_generation_logits cannot be combined with beam "
                               "search (beam_width > 1) in this demo model")
        items.append(Item(prompt, sampling, count, inputs.scalar("exclude_input_in_output", i, exclude_input, bool)))
    return items


def _grammar(inputs: Inputs, item: int, compile_guide: Callable[[str, str], Any] | None) -> Any:
    """`guided_decoding_guide_type` and `guided_decoding_guide` (both, or the type `json` alone)."""
    kind = inputs.scalar("guided_decoding_guide_type", item, None, _text)
    guide = inputs.scalar("guided_decoding_guide", item, None, _text)
    if kind is None:
        _assert(guide is None, "guided_decoding_guide is set but guided_decoding_guide_type is not")
        return None
    _assert(guide is not None or kind == "json", f"guided_decoding_guide_type {kind} needs guided_decoding_guide")
    if compile_guide is None:
        raise RequestError("guided decoding is not enabled (guided_decoding_backend)")
    return compile_guide(kind, guide or "")


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _words(inputs: Inputs, name: str, item: int) -> list[list[int]]:
    row = inputs.row(name, item)
    return [] if row is None else word_list([int(v) for v in row])


def _bias(inputs: Inputs, item: int, vocab_size: int) -> Any:
    row = inputs.row("embedding_bias", item)
    if row is None or row.size == 0:
        return None
    if row.size != vocab_size:
        raise RequestError(f"embedding_bias has {row.size} values; the vocabulary has {vocab_size}")
    return row.astype(np.float32)


def logit_outputs(seq: Sequence, start: int, count: int) -> dict[str, np.ndarray]:
    """`context_logits` [1, prompt length, vocab] in a sequence's first response, and `generation_logits`
    [1, 1, count, vocab] of generated tokens [start, start + count), where the sequence asked for them (FP32,
    as TensorRT-LLM's default `logits_datatype`)."""
    outputs = {}
    if start == 0 and seq.context_logits is not None:
        outputs["context_logits"] = seq.context_logits.numpy()[np.newaxis]
    rows = seq.generation_logits[start:start + count]
    if rows:
        outputs["generation_logits"] = np.stack([row.numpy() for row in rows])[np.newaxis, np.newaxis]
    return outputs


class TrtllmRequest(Owner):
    """One request: its generations and their responses. `emit` sends a response, `emit_error` an
    error; a subclass in each model.py writes them as Triton responses."""

    def __init__(self, items: list[Item], *, streaming: bool, request_id: str, cancelled: Callable[[], bool],
                 return_num_input_tokens: bool = False, return_num_output_tokens: bool = False) -> None:
        self.items, self.streaming, self.request_id, self.cancelled = items, streaming, request_id, cancelled
        self.return_num_input_tokens = return_num_input_tokens
        self.return_num_output_tokens = return_num_output_tokens
        self.slots: list[tuple[int, int]] = []  # per sequence: (batch index, sequence index)
        self.seqs: list[Sequence] = []
        for b, item in enumerate(items):
            for k in range(1 if item.sampling.beam_width > 1 else item.num_return_sequences):
                seed = None if item.sampling.seed is None else item.sampling.seed + k
                sampling = dataclasses.replace(item.sampling, seed=seed)
                self.seqs.append(Sequence(item.prompt, sampling, self, index=len(self.slots)))
                self.slots.append((b, k))
        self.open = len(self.seqs)
        self.stop_requested = False
        self.failed = False
        self.lock = threading.Lock()

    # --- what a model.py writes ----------------------------------------------------------------

    def emit(self, seq: Sequence, outputs: dict[str, np.ndarray], ended: bool, last: bool) -> None:
        """Send one response of `seq`; `ended`: its last; `last`: the request's last (the FINAL flag)."""
        raise NotImplementedError

    def emit_error(self, message: str) -> None:
        """Send an error response with the FINAL flag."""
        raise NotImplementedError

    # --- the engine's callbacks ----------------------------------------------------------------

    def aborted(self) -> str | None:
        if self.failed:
            return "failed"
        if self.stop_requested:
            return "stopped"
        return "cancelled" if self.cancelled() else None

    def on_token(self, seq: Sequence, reason: str | None) -> str | None:
        if self.streaming:  # the new token, unless it is the end id that ended the generation
            ended_by_end_id = reason == "stop" and seq.tokens[-1] in seq.sampling.end_ids
            self._respond(seq, seq.generated - 1, 0 if ended_by_end_id else 1, final=reason is not None)
        elif reason is not None:
            self._respond_whole(seq, reason)
        return reason

    def on_abort(self, seq: Sequence, why: str) -> None:
        if why == "failed":
            return
        if self.streaming:
            self._respond(seq, seq.generated, 0, final=True)
        else:
            self._respond_whole(seq, None)

    def on_beams(self, search: BeamSearch) -> None:
        seq, s = search.request, search.request.sampling
        item = self.items[self.slots[seq.index][0]]
        if not self.streaming and not search.done:
            return
        prompt = [] if self.streaming or item.exclude_input else seq.prompt
        arrays = beam_arrays(search.best(), item.num_return_sequences, prefix=prompt, keep_end=False,
                             end_ids=s.end_ids, pad=-1)
        outputs = {"output_ids": arrays["output_ids"].astype(np.int32),
                   "sequence_length": arrays["sequence_length"].astype(np.int32)}
        if s.logprobs:
            outputs["output_log_probs"] = arrays["output_log_probs"]
            outputs["cum_log_probs"] = arrays["cum_log_probs"]
        self._send(seq, outputs, final=search.done)

    def on_error(self, seq: Sequence, message: str) -> None:
        with self.lock:
            if self.failed:
                return
            self.failed = True
        self.emit_error(f"Executor failed process requestId {seq.index} due to the following error: {message}")

    # --- responses -----------------------------------------------------------------------------

    def _respond_whole(self, seq: Sequence, reason: str | None) -> None:
        generated = seq.generated
        if reason == "stop" and seq.tokens[-1] in seq.sampling.end_ids:
            generated -= 1
        prompt = 0 if self.items[self.slots[seq.index][0]].exclude_input else len(seq.prompt)
        self._respond(seq, 0, generated, final=True, prompt=prompt)

    def _respond(self, seq: Sequence, start: int, count: int, final: bool, prompt: int = 0) -> None:
        """Respond with generated tokens [start, start + count), after `prompt` prompt tokens."""
        generated = seq.new_tokens()[start:start + count]
        ids = seq.prompt[:prompt] + generated
        outputs: dict[str, np.ndarray] = {
            "output_ids": np.array(ids, dtype=np.int32).reshape(1, 1, len(ids)),
            "sequence_length": np.array([[len(ids)]], dtype=np.int32),
        }
        if seq.sampling.logprobs:
            log_probs = seq.logprobs[start:start + count]
            outputs["output_log_probs"] = np.array(log_probs, dtype=np.float32).reshape(1, 1, len(log_probs))
            outputs["cum_log_probs"] = np.array([[sum(seq.logprobs[:start + count])]], dtype=np.float32)
        outputs.update(logit_outputs(seq, start, count))
        if self.return_num_output_tokens:
            outputs["num_output_tokens"] = np.array([[len(ids)]], dtype=np.int32)
        self._send(seq, outputs, final)

    def _send(self, seq: Sequence, outputs: dict[str, np.ndarray], final: bool) -> None:
        """Add the outputs every response may carry and send it; `final`: `seq`'s last."""
        batch_index, sequence_index = self.slots[seq.index]
        if len(self.items) > 1:
            outputs["batch_index"] = np.array([[batch_index]], dtype=np.int32)
        if self.items[batch_index].num_return_sequences > 1 and seq.sampling.beam_width == 1:
            outputs["sequence_index"] = np.array([[sequence_index]], dtype=np.int32)
        if self.return_num_input_tokens:
            outputs["num_input_tokens"] = np.array([[len(seq.prompt)]], dtype=np.int32)
        last = False
        if final:
            with self.lock:
                self.open -= 1
                last = self.open == 0
        self.emit(seq, outputs, final, last)
