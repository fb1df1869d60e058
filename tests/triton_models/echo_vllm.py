"""vllm-echo: the echo (echo_core) on the vLLM backend's Triton interface (vllm_backend src/model.py and
src/utils/request.py; vLLM's SamplingParams and V1 detokenizer for the text rules).

- Decoupled, `max_batch_size: 0`. `text_input` is tokenized with the demo LLM's tokenizer
  (echo_core.Tokenizer). `sampling_parameters` is a JSON object of SamplingParams fields (or, without
  that tensor, the request's Triton parameters); as TritonSamplingParams.from_dict does, None values are
  dropped and values of scalar fields are coerced to the field's type from strings ("5" -> 5; note
  that "false" -> True, as bool("false") in the real backend). Honoured: `max_tokens` (default 16; null:
  the rest of `max_model_len`), `min_tokens`, `stop` (str or list), `stop_token_ids`,
  `include_stop_str_in_output`, `ignore_eos`, `skip_special_tokens`, `n`, `logprobs`; the other
  sampling fields are checked and ignored. An unknown field or a value SamplingParams refuses fails the
  request.
- Generation: sequence k of `n` echoes the prompt from its k-th token. It stops at the tokenizer's EOS
  (unless `ignore_eos`) or a `stop_token_ids` token ("stop"; the token counts as generated but its text
  is not shown unless `include_stop_str_in_output`), at a `stop` string ("stop"; the text is cut before
  it, or after it with `include_stop_str_in_output`), or after `max_tokens` ("length"). Before
  `min_tokens` tokens no stop token is generated and no stop string is looked for. The `n` sequences
  advance together and every response carries one element per sequence, as vLLM V0's RequestOutputs
  did (V1 reports one child sequence per output, which vllm_backend does not index: an adapter should
  send `n` = 1 requests).
- Text is decoded incrementally as vLLM does: a token whose character's bytes are not all generated
  yet is held back (with its whole text), and while stop strings may still match (not
  `include_stop_str_in_output`) the last len(longest stop) - 1 characters are held back until the
  sequence finishes.
- Streaming (`stream`): each response's `text_output` [n] holds each sequence's new text (never the
  prompt; `exclude_input_in_output` false is an error), and the response with which the request
  finishes carries FINAL together with its data. Not streaming: one response, prompt + text for each
  sequence unless `exclude_input_in_output`.
- Optional outputs, each only when its `return_*` input is true: `finish_reason` [n] ("stop", "length",
  or "None" while unfinished, str() of vLLM's value), `cumulative_logprob` [n] (NaN unless
  `logprobs` was asked for), `logprobs` [n] (JSON per sequence for the new positions:
  `[{token_id: {"logprob", "rank", "decoded_token"}}]`, `logprobs` alternatives per position, or
  "null"), `num_input_tokens` (a 0-d UINT32, as the backend builds it), `num_output_tokens` [n] (tokens
  since the previous response).
- LoRA: a `lora_name` must be a key of the model's `1/multi_lora.json` (without that file: "LoRA feature
  is not enabled."; another name: "LoRA <name> is not supported, we currently support [...]", an error
  response as vllm_backend's _verify_loras sends, here with the prefix below); the generation is the
  echo whatever the adapter, and the request's events report its `lora_name`.
- `structured_outputs` (or before vLLM 0.11 `guided_decoding`): a JSON object of StructuredOutputsParams
  fields (or its JSON text, as the backend reads it) with exactly one kind of constraint (`json`,
  `json_object`, `regex`, `choice`, `grammar`, `structural_tag`; wording of the refusal ours), reported in
  the request's events as `structured_outputs` (the object), but not enforced: the generation is the echo.
- `image` (optional, base64 image files, as vllm_backend's multimodal input): each is decoded and
  reported in an event {"event": "images", "model", "request_id", "images": [{"type", "bytes",
  "sha256"}]} (type sniffed from the first bytes; "unknown" otherwise); the echo itself ignores them.
- Errors: a FINAL response with `text_output` ["N/A"] and the error "Error generating stream: ..."
  (INTERNAL). Cancellation, streaming: a FINAL error "Request was cancelled" (CANCELLED); not
  streaming: the partial output as the final response.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
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
    send,
    string_tensor,
    strings,
    tensor,
)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# SamplingParams fields: the type from-strings coercion applies (None: not coerced).
FIELDS: dict[str, Any] = {
    "n": int, "best_of": int, "presence_penalty": float, "frequency_penalty": float, "repetition_penalty": float,
    "temperature": float, "top_p": float, "top_k": int, "min_p": float, "seed": int, "stop": None,
    "stop_token_ids": None, "bad_words": None, "include_stop_str_in_output": bool, "ignore_eos": bool,
    "max_tokens": int, "min_tokens": int, "logprobs": int, "prompt_logprobs": int, "detokenize": bool,
    "skip_special_tokens": bool, "spaces_between_special_tokens": bool, "truncate_prompt_tokens": int,
    "logit_bias": None, "allowed_token_ids": None, "extra_args": None, "structured_outputs": None,
    "guided_decoding": None, "lora_name": str,
}
DEFAULTS: dict[str, Any] = {
    "n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "temperature": 1.0,
    "top_p": 1.0, "top_k": 0, "min_p": 0.0, "stop": [], "stop_token_ids": [], "include_stop_str_in_output": False,
    "ignore_eos": False, "max_tokens": 16, "min_tokens": 0, "logprobs": None, "skip_special_tokens": True,
}


def sniff(data: bytes) -> str:
    """The image type from the file's first bytes, as vLLM's image loader (PIL) would tell it."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    magic = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff": "image/jpeg", b"GIF8": "image/gif"}
    return next((kind for prefix, kind in magic.items() if data.startswith(prefix)), "unknown")


STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


def structured_outputs(params: dict[str, Any]) -> dict[str, Any]:
    """The request's structured outputs, checked, for its events (see the module docstring)."""
    given = params.get("structured_outputs", params.get("guided_decoding"))
    if given is None:
        return {}
    try:
        value = json.loads(given) if isinstance(given, str) else given
    except ValueError as exc:
        raise RequestError(f"invalid structured_outputs: {exc}") from None
    kinds = [kind for kind in STRUCTURED_KINDS if isinstance(value, dict) and value.get(kind) not in (None, False)]
    if len(kinds) != 1:
        raise RequestError(f"structured_outputs must set exactly one of {', '.join(STRUCTURED_KINDS)}; got {given!r}")
    return {"structured_outputs": value}


def sampling_params(raw: str) -> dict[str, Any]:
    """SamplingParams from JSON, with vLLM's checks (its messages)."""
    try:
        given = {k: v for k, v in json.loads(raw or "{}").items() if v is not None}
        for key, value in given.items():
            if key not in FIELDS:
                raise ValueError(f"Unexpected keyword argument '{key}'")
            if FIELDS[key] is not None:
                given[key] = FIELDS[key](value)
    except (TypeError, ValueError) as exc:
        raise RequestError(f"invalid sampling_parameters: {exc}") from None
    params = DEFAULTS | given
    if isinstance(params["stop"], str):
        params["stop"] = [params["stop"]]
    n, max_tokens, min_tokens, top_k = params["n"], params["max_tokens"], params["min_tokens"], params["top_k"]
    checks = [
        (n >= 1, f"n must be at least 1, got {n}."),
        (-2 <= params["presence_penalty"] <= 2,
         f"presence_penalty must be in [-2, 2], got {params['presence_penalty']}."),
        (-2 <= params["frequency_penalty"] <= 2,
         f"frequency_penalty must be in [-2, 2], got {params['frequency_penalty']}."),
        (params["repetition_penalty"] > 0,
         f"repetition_penalty must be greater than zero, got {params['repetition_penalty']}."),
        (params["temperature"] >= 0, f"temperature must be non-negative, got {params['temperature']}."),
        (0 < params["top_p"] <= 1, f"top_p must be in (0, 1], got {params['top_p']}."),
        (top_k >= -1, f"top_k must be 0 (disable), or at least 1, got {top_k}."),
        (0 <= params["min_p"] <= 1, f"min_p must be in [0, 1], got {params['min_p']}."),
        (max_tokens is None or max_tokens >= 1, f"max_tokens must be at least 1, got {max_tokens}."),
        (min_tokens >= 0, f"min_tokens must be greater than or equal to 0, got {min_tokens}."),
        (max_tokens is None or min_tokens <= max_tokens,
         f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}."),
        (params["logprobs"] is None or params["logprobs"] >= 0,
         f"logprobs must be non-negative, got {params['logprobs']}."),
        ("" not in params["stop"], "stop cannot contain an empty string."),
    ]
    for ok, message in checks:
        if not ok:
            raise RequestError(message)
    return params


@dataclass
class VllmJob(Job):
    tokenizer: Any = None
    prompt: str = ""
    prepend: bool = False
    returns: dict[str, bool] = field(default_factory=dict)
    stops: list[str] = field(default_factory=list)
    include_stop: bool = False
    skip_special: bool = True
    logprobs: int | None = None
    cut: dict[int, str] = field(default_factory=dict)  # sequence -> its text, cut at a stop string
    sent_text: list[int] = field(default_factory=list)  # per sequence: what was already sent
    sent_tokens: list[int] = field(default_factory=list)
    checked: dict[int, int] = field(default_factory=dict)  # per sequence: text length searched for stops

    def __post_init__(self) -> None:
        self.sent_text = [0] * len(self.sequences)
        self.sent_tokens = [0] * len(self.sequences)
        self.hold = max(map(len, self.stops)) - 1 if self.stops and not self.include_stop else 0

    def text(self, k: int) -> str:
        """Sequence k's detokenized text so far: no stop token's text, no partial character."""
        if k in self.cut:
            return self.cut[k]
        echo = self.sequences[k]
        ids = echo.tokens[:-1] if echo.finish == "end_id" and not self.include_stop else echo.tokens
        text = self.tokenizer.decode(ids, self.skip_special)
        while text.endswith("\ufffd"):  # a token whose character is incomplete waits, as in vLLM's detokenizer
            ids = ids[:-1]
            text = self.tokenizer.decode(ids, self.skip_special)
        return str(text)

    def after_step(self, sequence: Echo) -> None:
        k = self.sequences.index(sequence)
        if sequence.finish is not None or not self.stops or len(sequence.tokens) < sequence.min_tokens:
            return
        text = self.text(k)
        new = len(text) - self.checked.get(k, 0)
        self.checked[k] = len(text)
        for stop in self.stops:  # vLLM's check_stop_strings: only where new text could complete it
            index = text.find(stop, max(0, len(text) + 1 - new - len(stop)))
            if index == -1:
                continue
            end = index + len(stop) if self.include_stop else index
            sequence.finish, self.cut[k] = "stop_string", text[:end]
            return

    def shown(self, k: int) -> str:
        """Sequence k's text as far as it may be shown now."""
        text = self.text(k)
        return text if self.sequences[k].finish else text[: max(self.sent_text[k], len(text) - self.hold)]

    def finish_reason(self, k: int) -> str:
        return {None: "None", "length": "length"}.get(self.sequences[k].finish, "stop")

    def position_logprobs(self, token: int, position: int) -> dict[int, dict[str, Any]]:
        """The sampled token (rank 1) and `logprobs` - 1 lower alternatives."""
        entries = {}
        for rank in range(1, max(1, self.logprobs or 0) + 1):
            token_id = (token + rank - 1) % self.tokenizer.vocab_size
            entries[token_id] = {"logprob": log_prob(position) - (rank - 1), "rank": rank,
                                 "decoded_token": self.tokenizer.decode([token_id], False)}
        return entries


class VllmEchoModel(EchoModel):
    def setup(self) -> None:
        self.tokenizer = Tokenizer(self.param("tokenizer_dir", DEMO_TOKENIZER))
        self.max_model_len = int(self.param("max_model_len", "8192"))
        self.max_logprobs = int(self.param("max_logprobs", "20"))
        loras = Path(self.args["model_repository"]) / self.args["model_version"] / "multi_lora.json"
        self.supported_loras = list(json.loads(loras.read_text())) if loras.exists() else None

    def check_lora(self, name: str | None) -> dict[str, Any]:
        """vllm_backend's _verify_loras: `lora_name` must be in the model's multi_lora.json."""
        if name is None:
            return {}
        if self.supported_loras is None:
            raise RequestError("LoRA feature is not enabled.")
        if name not in self.supported_loras:
            raise RequestError(f"LoRA {name} is not supported, we currently support {self.supported_loras}")
        return {"lora_name": name}

    def error_response(self, message: str, code: int) -> Any:
        return pb_utils.InferenceResponse(output_tensors=[string_tensor("text_output", ["N/A"])],
                                          error=pb_utils.TritonError(f"Error generating stream: {message}", code))

    def on_cancel(self, sender: Any, job: Job) -> None:
        if job.streaming:
            error = pb_utils.TritonError("Request was cancelled", pb_utils.TritonError.CANCELLED)
            send(sender, pb_utils.InferenceResponse(error=error), FINAL)
        else:
            send(sender, self.respond(job, True), FINAL)

    def report_images(self, request: Any) -> None:
        images = [base64.b64decode(text) for text in strings(request, "image") or []]
        if images:
            event(event="images", model=self.name, request_id=request.request_id(), images=[
                {"type": sniff(data), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                for data in images])

    def parse(self, request: Any) -> Job:
        self.report_images(request)
        prompt = (strings(request, "text_input") or [""])[0]
        stream = bool(scalar(request, "stream", False, bool))
        exclude = tensor(request, "exclude_input_in_output")
        prepend = not bool(exclude.reshape(-1)[0]) if exclude is not None else not stream
        if prepend and stream:
            raise RequestError("When streaming, `exclude_input_in_output` = False is not allowed.")
        raw = strings(request, "sampling_parameters")
        params = sampling_params(raw[0] if raw else request.parameters())
        if params["logprobs"] is not None and params["logprobs"] > self.max_logprobs:
            raise RequestError(f"Requested sample logprobs of {params['logprobs']}, which is greater than max "
                               f"allowed: {self.max_logprobs}")
        ids = self.tokenizer.encode(prompt)
        if not ids or len(ids) >= self.max_model_len:
            raise RequestError(f"The decoder prompt (length {len(ids)}) is empty or longer than the maximum "
                               f"model length of {self.max_model_len}.")
        room = self.max_model_len - len(ids)
        max_new = room if params["max_tokens"] is None else min(params["max_tokens"], room)
        end_ids = set(params["stop_token_ids"]) | (set() if params["ignore_eos"] else {self.tokenizer.eos_id})
        sequences = [Echo(prompt=ids, max_new=max_new, end_ids=frozenset(end_ids), min_tokens=params["min_tokens"],
                          start=k) for k in range(params["n"])]
        returns = {name: bool(scalar(request, f"return_{name}", False, bool))
                   for name in ("finish_reason", "cumulative_logprob", "logprobs", "num_input_tokens",
                                "num_output_tokens")}
        return VllmJob(request.request_id(), sequences, streaming=stream, tokenizer=self.tokenizer, prompt=prompt,
                       prepend=prepend, returns=returns, stops=params["stop"],
                       include_stop=params["include_stop_str_in_output"],
                       skip_special=params["skip_special_tokens"], logprobs=params["logprobs"],
                       report={**self.check_lora(params.get("lora_name")), **structured_outputs(params)},
                       **self.knobs(request))

    def respond(self, job: VllmJob, done: bool) -> Any:
        count = range(len(job.sequences))
        texts = []
        for k in count:
            shown = job.shown(k)
            texts.append((job.prompt if job.prepend else "") + shown[job.sent_text[k]:])
            job.sent_text[k] = len(shown)
        outputs = [string_tensor("text_output", texts)]
        if job.returns["finish_reason"]:
            outputs.append(string_tensor("finish_reason", [job.finish_reason(k) for k in count]))
        if job.returns["cumulative_logprob"]:
            cumulative = [sum(map(log_prob, range(len(s.tokens)))) if job.logprobs is not None else math.nan
                          for s in job.sequences]
            outputs.append(pb_utils.Tensor("cumulative_logprob", np.array(cumulative, dtype=np.float32)))
        if job.returns["logprobs"]:
            outputs.append(string_tensor("logprobs", [
                "null" if job.logprobs is None else json.dumps([
                    job.position_logprobs(s.tokens[p], p) for p in range(job.sent_tokens[k], len(s.tokens))])
                for k, s in enumerate(job.sequences)]))
        if job.returns["num_input_tokens"]:
            outputs.append(pb_utils.Tensor("num_input_tokens",
                                           np.asarray(len(job.sequences[0].prompt), dtype=np.uint32)))
        if job.returns["num_output_tokens"]:
            outputs.append(pb_utils.Tensor("num_output_tokens", np.array(
                [len(s.tokens) - job.sent_tokens[k] for k, s in enumerate(job.sequences)], dtype=np.uint32)))
        job.sent_tokens = [len(s.tokens) for s in job.sequences]
        return pb_utils.InferenceResponse(output_tensors=outputs)
