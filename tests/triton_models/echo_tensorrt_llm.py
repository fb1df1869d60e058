"""The echo (echo_core) on TensorRT-LLM's two Triton interfaces, decoupled.

`TrtllmEchoModel` (trtllm-echo, trtllm-echo-v0) is the C++ `tensorrt_llm` model
(triton_backend/inflight_batcher_llm/src: utils.cc createRequestsFromInputTensors,
model_instance_state.cc fillTritonResponse; the executor's LlmRequest::createResult):

- Input names come from the model's own config: `seed`/`random_seed` and `min_tokens`/`min_length`,
  whichever it declares; `exclude_input_in_output`, `return_num_input_tokens` and
  `return_num_output_tokens` only when declared (else the model parameter `exclude_input_in_output`).
- The prompt is the whole of `input_ids` [1, L]; `input_lengths` is required but, as in the C++ backend
  for a batch of one, not read. Sampling inputs are accepted and ignored.
- Beam search: `beam_width` up to the model parameter `max_beam_width` (default 1, as TensorRT-LLM's)
  makes that many sequences, beam k the echo starting at prompt token k (echo_core), best first; a wider
  beam fails the request. With beams, `output_ids` is [1, beams, longest] (shorter beams padded with -1)
  and `sequence_length` [1, beams], and a streamed response holds every beam's tokens so far, not only
  the new ones (LlmRequest sets returnAllGeneratedTokens when streaming with beams).
- `end_id` defaults to -1: without it generation does not stop at an end token. The end token is not
  in the output (the executor drops it), `min_tokens` keeps end tokens out until that many tokens (it
  does not delay stop words: TRT-LLM's min-length penalty touches only the end id's logit), stop words
  stay in the output (the executor keeps them; TRT-LLM's LLM API trims them itself).
- Streaming (`streaming`): each response holds only the new tokens, `output_ids` [1, 1, k] and
  `sequence_length` [1, 1] = k; the FINAL flag rides on the last data response, which may hold no token
  (k = 0) when it ends at the end id. Not streaming: one response, prompt + completion unless
  `exclude_input_in_output`.
- `return_log_probs`: `output_log_probs` [1, 1, G] holds ALL G tokens generated so far (also when
  streaming: the executor's list only grows) and `cum_log_probs` [1, 1] their sum.
- `num_input_tokens` [1, 1] is the prompt length; `num_output_tokens` [1, 1] counts the ids of this
  response's `output_ids`, so the prompt too when it is there (fillTritonResponse counts outputIds).
- KV cache reuse, simulated honestly: the model remembers the last `RECENT_PROMPTS` prompts it served
  (per LoRA task, as TensorRT-LLM reuses blocks only within one), and a new prompt reuses the full blocks
  of its longest prefix shared with one of them, up to its last token (which is always computed), blocks
  of the model parameter `tokens_per_block` (the engine's `--tokens_per_block`, 64 here as
  `llm[].tokens_per_block`'s default). With `return_perf_metrics` every response carries
  `kv_cache_reused_blocks` [1, 1].
- Guided decoding (`guided_decoding_guide_type`, `guided_decoding_guide`, where declared): checked as the
  backend does (a known guide type; a guide unless the type is `json`; wording ours) and reported in the
  request's events (`guide_type`, `guide`), but not enforced: the generation is the echo.
- LoRA (`lora_task_id`, `lora_weights`, `lora_config`, where declared), as the executor's PEFT cache: a
  task id with weights and config caches them (at most the model parameter `lora_cache_size` tasks, the
  oldest evicted first); a task id alone must be cached, else the request fails with "LoRA task <id> not
  found in cache. Please send LoRA weights with request" (and a `lora_not_cached` event). The generation
  is the echo whatever the adapter; each event of the request reports `lora_task_id`, whether the
  weights came with it (`lora_weights_sent`), and the cached weights' and config's shapes and sums.
- `return_context_logits` (trtllm-echo declares it and `context_logits`, as every TensorRT-LLM config
  does) fails as on an engine built without `gather_context_logits`: the echo keeps no logits.
- Errors are INTERNAL error responses with the C++ check's text: malformed word lists (the strict
  `convertWordList` checks), `request_output_len` < 1, an empty prompt, `end_id` outside [-1, vocab),
  a request whose outputs leave out `output_ids` or `sequence_length`. A cancelled request ends with an
  empty FINAL response (the client has gone; what the C++ backend sends then is not observable).

`TrtllmTextEchoModel` (trtllm-text-echo, trtllm-bls-echo-accumulate) is the `ensemble` /
`tensorrt_llm_bls` text interface: preprocessing, the model above, postprocessing, in one model.

- `text_input` is tokenized with the demo LLM's tokenizer (echo_core.Tokenizer); `end_id` and `pad_id`
  default to the tokenizer's (as preprocessing fills them), so the echo stops at `<|im_end|>`;
  `stop_words`/`bad_words` are one word per element, tokenized without special tokens.
- `text_output` [1, 1] is the decode (special tokens skipped) of what the model above would return:
  streaming, each response's new tokens on their own (a delta; a character whose bytes span two
  responses comes out as U+FFFD pieces, as postprocessing decodes them) or, with the BLS parameter
  `accumulate_tokens` true, all tokens so far (cumulative text); not streaming, prompt + completion
  unless `exclude_input_in_output`. The stop word's text stays. Log probs and token counts as above.
- FINAL comes as a separate flags-only response after the last data (or error) response, as the BLS
  model sends it (tensorrtllm_backend issue #552); tritonclient's aio `stream_infer` never shows it.
- `max_tokens` < 1 fails as the BLS validation does ("max_tokens must be a single value > 0").
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from echo_core import (
    DEMO_TOKENIZER,
    Echo,
    EchoModel,
    Job,
    RequestError,
    Tokenizer,
    event,
    log_prob,
    scalar,
    string_tensor,
    strings,
    tensor,
)

TRUE = ("true", "yes", "1", "t")
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag")
RECENT_PROMPTS = 16  # prompts the simulated KV cache remembers


def assertion(message: str) -> RequestError:
    """A failed TLLM_CHECK, worded as the C++ backend reports it."""
    return RequestError(f"[TensorRT-LLM][ERROR] Assertion failed: {message}")


def sparse_word_list(request: Any, name: str) -> list[list[int]]:
    """A [1, 2, N] word list, checked like the C++ backend's convertWordList: the ids row, then the
    offsets row, each offset <= N and above the previous one, and only -1s after the first -1."""
    arr = tensor(request, name)
    if arr is None:
        return []
    flat = [int(v) for v in arr.reshape(-1)]
    listed = "".join(f"{v} " for v in flat)

    def check(ok: bool, what: str) -> None:
        if not ok:
            raise assertion(f"Sparse list must not have {what}: {listed}")

    check(len(flat) % 2 == 0, "odd length")
    count = len(flat) // 2
    words, current = [], 0
    for i in range(count, len(flat)):
        if flat[i] == -1:
            check(all(v == -1 for v in flat[i + 1:]), "additional -1s")
            break
        check(flat[i] <= count, "out-of-bound offsets")
        if i != count:
            check(flat[i] > flat[i - 1], "non-increasing offsets")
        end = max(current, flat[i])
        words.append(flat[current:end])
        current = end
    return [w for w in words if w]


@dataclass
class TrtllmJob(Job):
    exclude_input: bool = False
    log_probs: bool = False
    num_input: bool = False
    num_output: bool = False
    reused_blocks: int | None = None  # KV cache blocks of the prompt reused from earlier prompts, when asked
    sent: int = 0  # output tokens already streamed

    @property
    def echo(self) -> Echo:
        return self.sequences[0]

    def visible(self, beam: int = 0) -> list[int]:
        """The generated tokens TRT-LLM returns: an end token is not among them."""
        echo = self.sequences[beam]
        return echo.tokens[:-1] if echo.finish == "end_id" else echo.tokens

    def response_ids(self) -> list[int]:
        """What this response's `output_ids` hold; streaming, only what is new since the last one."""
        visible = self.visible()
        if self.streaming:
            new, self.sent = visible[self.sent:], len(visible)
            return new
        return ([] if self.exclude_input else self.echo.prompt) + visible

    def beam_ids(self) -> list[list[int]]:
        """Each beam's `output_ids` row: with beams, streaming too, all its tokens so far."""
        if len(self.sequences) == 1:
            return [self.response_ids()]
        prompt = [] if self.streaming or self.exclude_input else self.echo.prompt
        return [prompt + self.visible(k) for k in range(len(self.sequences))]

    def extra_outputs(self, ids: list[int]) -> list[Any]:
        outputs = []
        if self.log_probs:
            rows = [[log_prob(i, k) for i in range(len(self.visible(k)))] for k in range(len(self.sequences))]
            values = np.zeros((1, len(rows), max(map(len, rows))), dtype=np.float32)
            for k, row in enumerate(rows):
                values[0, k, : len(row)] = row
            outputs += [pb_utils.Tensor("output_log_probs", values),
                        pb_utils.Tensor("cum_log_probs", values.sum(axis=2))]
        if self.num_input:
            outputs.append(pb_utils.Tensor("num_input_tokens", np.array([[len(self.echo.prompt)]], dtype=np.int32)))
        if self.num_output:
            outputs.append(pb_utils.Tensor("num_output_tokens", np.array([[len(ids)]], dtype=np.int32)))
        if self.reused_blocks is not None:
            outputs.append(pb_utils.Tensor("kv_cache_reused_blocks", np.array([[self.reused_blocks]], dtype=np.int32)))
        return outputs


def _shared(prompt: tuple[int, ...], earlier: tuple[int, ...]) -> int:
    """The length of the prefix the two prompts share."""
    return next((i for i, (a, b) in enumerate(zip(prompt, earlier, strict=False)) if a != b),
                min(len(prompt), len(earlier)))


class TrtllmEchoModel(EchoModel):
    def setup(self) -> None:
        self.vocab_size = int(self.param("vocab_size", "49152"))
        self.exclude_default = self.param("exclude_input_in_output", "false").lower() in TRUE
        self.lora_cache: OrderedDict[int, dict[str, Any]] = OrderedDict()  # task id -> what its weights were
        self.lora_cache_size = int(self.param("lora_cache_size", "8"))
        self.max_beam_width = int(self.param("max_beam_width", "1"))
        self.tokens_per_block = int(self.param("tokens_per_block", "64"))
        self.recent: OrderedDict[tuple[int | None, tuple[int, ...]], None] = OrderedDict()  # (LoRA task, prompt)

    def declared(self, *names: str) -> str:
        """The first of `names` this model's config declares (names changed between TRT-LLM versions)."""
        return next((n for n in names if n in self.inputs), names[-1])

    def flag(self, request: Any, name: str, default: bool = False) -> bool:
        return bool(scalar(request, name, default, bool)) if name in self.inputs else default

    def lora(self, request: Any) -> dict[str, Any]:
        """The request's LoRA task, through the cache (see the module docstring): what its events report."""
        task_id = scalar(request, "lora_task_id", None, int) if "lora_task_id" in self.inputs else None
        if task_id is None:
            return {}
        weights, config = tensor(request, "lora_weights"), tensor(request, "lora_config")
        sent = weights is not None and config is not None
        with self.lock:
            if sent:
                self.lora_cache.pop(task_id, None)
                self.lora_cache[task_id] = {
                    "lora_weights_shape": list(weights.shape), "lora_config_shape": list(config.shape),
                    "lora_weights_sum": float(weights.astype(np.float64).sum()),
                    "lora_config_sum": int(config.astype(np.int64).sum())}
                while len(self.lora_cache) > self.lora_cache_size:
                    self.lora_cache.popitem(last=False)
            elif task_id not in self.lora_cache:
                event(event="lora_not_cached", model=self.name, request_id=request.request_id(), lora_task_id=task_id)
                raise RequestError(f"LoRA task {task_id} not found in cache. Please send LoRA weights with request")
            return {"lora_task_id": task_id, "lora_weights_sent": sent, **self.lora_cache[task_id]}

    def reuse(self, prompt: list[int], task: int | None) -> int:
        """The full KV cache blocks of `prompt` an earlier prompt of the same LoRA task left (see the module
        docstring); `prompt` is remembered."""
        key = tuple(prompt)
        with self.lock:
            shared = max((_shared(key, earlier) for (own, earlier) in self.recent if own == task), default=0)
            self.recent.pop((task, key), None)
            self.recent[(task, key)] = None
            while len(self.recent) > RECENT_PROMPTS:
                self.recent.popitem(last=False)
        return min(shared, len(prompt) - 1) // self.tokens_per_block

    def guide(self, request: Any) -> dict[str, Any]:
        """The request's guided decoding, checked, for its events (see the module docstring)."""
        kind = (strings(request, "guided_decoding_guide_type") or [None])[0]
        guide = (strings(request, "guided_decoding_guide") or [None])[0]
        if kind is None:
            if guide is not None:
                raise RequestError("guided_decoding_guide is set but guided_decoding_guide_type is not")
            return {}
        if kind not in GUIDE_TYPES:
            raise RequestError(f"guided_decoding_guide_type {kind!r} is not one of {', '.join(GUIDE_TYPES)}")
        if guide is None and kind != "json":
            raise RequestError(f"guided_decoding_guide_type {kind} needs guided_decoding_guide")
        return {"guide_type": kind, "guide": guide}

    def common(self, request: Any, prompt: list[int], max_new: int, end_id: int, stop_words: list[list[int]],
               bad_words: list[list[int]], streaming: bool) -> TrtllmJob:
        """The job as the executor sees it, after the interface-specific inputs are read."""
        if not prompt:
            raise assertion("!mInputTokenIds.empty()")
        if max_new <= 0:
            raise assertion("mMaxNewTokens > 0")
        if self.flag(request, "return_context_logits"):  # the executor's check when it takes the request
            raise RequestError("Executor failed process requestId 1 due to the following error: [TensorRT-LLM]"
                               "[ERROR] Return context logit need to build engine with gather_context_logits")
        if not -1 <= end_id < self.vocab_size:
            raise assertion(f"EndId ({end_id}) is not within acceptable range [-1, {self.vocab_size}).")
        beams = scalar(request, "beam_width", 1, int)
        if not 1 <= beams <= self.max_beam_width:  # wording ours
            raise assertion(f"beam width ({beams}) must be between 1 and max_beam_width ({self.max_beam_width})")
        echoes = [Echo(prompt=prompt, max_new=max_new, end_ids=frozenset([end_id]) if end_id >= 0 else frozenset(),
                       min_tokens=scalar(request, self.declared("min_tokens", "min_length"), 0, int),
                       stop_words=stop_words, bad_words=bad_words, start=k) for k in range(beams)]
        report = {**self.lora(request), **self.guide(request)}
        reused = self.reuse(prompt, report.get("lora_task_id"))
        return TrtllmJob(request.request_id(), echoes, streaming=streaming,
                         exclude_input=self.flag(request, "exclude_input_in_output", self.exclude_default),
                         log_probs=self.flag(request, "return_log_probs"),
                         num_input=self.flag(request, "return_num_input_tokens"),
                         num_output=self.flag(request, "return_num_output_tokens"), report=report,
                         reused_blocks=reused if self.flag(request, "return_perf_metrics") else None,
                         **self.knobs(request))

    def parse(self, request: Any) -> Job:
        requested = set(request.requested_output_names())
        for name in ("output_ids", "sequence_length"):
            if name not in requested:
                raise RequestError(f"Error encountered while populating response: [TensorRT-LLM][ERROR] "
                                   f"{name} tensor must be present in list of output tensors")
        ids = tensor(request, "input_ids")
        if ids is None:
            raise RequestError("input_ids or encoder_input_features is not present in the request.")
        return self.common(request, [int(t) for t in ids.reshape(-1)], scalar(request, "request_output_len", 0, int),
                           scalar(request, "end_id", -1, int), sparse_word_list(request, "stop_words_list"),
                           sparse_word_list(request, "bad_words_list"), self.flag(request, "streaming"))

    def respond(self, job: TrtllmJob, done: bool) -> Any:
        beams = job.beam_ids()
        output_ids = np.full((1, len(beams), max(map(len, beams))), -1, dtype=np.int32)
        for k, ids in enumerate(beams):
            output_ids[0, k, : len(ids)] = ids
        outputs = [pb_utils.Tensor("output_ids", output_ids),
                   pb_utils.Tensor("sequence_length", np.array([[len(ids) for ids in beams]], dtype=np.int32))]
        return pb_utils.InferenceResponse(output_tensors=outputs + job.extra_outputs(beams[0]))


class TrtllmTextEchoModel(TrtllmEchoModel):
    final_apart = True

    def setup(self) -> None:
        super().setup()
        self.tokenizer = Tokenizer(self.param("tokenizer_dir", DEMO_TOKENIZER))
        self.vocab_size = self.tokenizer.vocab_size
        # As the BLS model: accumulation needs the model decoupled, which every echo model is.
        self.accumulate = self.param("accumulate_tokens", "false").lower() in TRUE

    def words(self, request: Any, name: str) -> list[list[int]]:
        return [ids for ids in map(self.tokenizer.encode, strings(request, name) or []) if ids]

    def parse(self, request: Any) -> Job:
        max_tokens = scalar(request, "max_tokens", 0, int)
        if max_tokens <= 0:
            raise RequestError("Traceback (most recent call last):\n  (tensorrt_llm_bls validation)\n"
                               "lib.decode.RequestValidationError: max_tokens must be a single value > 0")
        text = (strings(request, "text_input") or [""])[0]
        return self.common(request, self.tokenizer.encode(text), max_tokens,
                           scalar(request, "end_id", self.tokenizer.eos_id, int), self.words(request, "stop_words"),
                           self.words(request, "bad_words"), self.flag(request, "stream"))

    def respond(self, job: TrtllmJob, done: bool) -> Any:
        ids = job.response_ids()
        shown = job.visible() if self.accumulate and job.streaming else ids
        outputs = [string_tensor("text_output", [self.tokenizer.decode(shown)], (1, 1))]
        return pb_utils.InferenceResponse(output_tensors=outputs + job.extra_outputs(ids))
