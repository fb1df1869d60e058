import os, site, sys  # noqa: E401, I001  (must come first; see below)

_site = os.environ.get("TRITONGATE_SITE_PACKAGES")
if _site:  # the Python-backend stub runs the base interpreter: the venv's packages first, and its .pth
    sys.path.insert(0, _site)  # files (an editable install of tritongate) through site.addsitedir
    site.addsitedir(_site)

"""SmolLM2-135M-Instruct behind the interface of Triton's vLLM backend (vllm_backend `src/model.py`,
`src/utils/request.py`, `src/utils/vllm_backend_utils.py`), on the engine every demo LLM shares.

- `text_input` is the prompt, tokenized with the tokenizer's special tokens (no chat template applied).
- `sampling_parameters`: a JSON object of vLLM `SamplingParams` fields, else the request's parameters.
  None values are dropped; string values are converted to the field's type as the backend does, with
  Python's constructors (so "0.1" is 0.1, and any non-empty string, "false" too, is true for a bool
  field). Supported: n, max_tokens (default 16), temperature (default 1; below 1e-5 greedy), top_p,
  top_k (0 or -1: off), min_p, seed (none: random), stop (a string or a list; cut from the text unless
  include_stop_str_in_output; checked only after min_tokens), stop_token_ids, ignore_eos, min_tokens,
  logprobs (alternatives per token, at most parameter `max_logprobs`), presence/frequency/repetition
  penalties, bad_words, logit_bias, allowed_token_ids, truncate_prompt_tokens, detokenize,
  skip_special_tokens, include_stop_str_in_output, spaces_between_special_tokens (ignored), and
  structured_outputs / guided_decoding (json, json_object, regex, choice, grammar; xgrammar, as vLLM). vLLM's range
  checks apply; an invalid or unknown field fails the request (the real backend fails it too, with a
  less telling message, as its parser returns None).
- `image` (optional, base64 image files, as the backend's multimodal input): each is decoded as vLLM
  decodes it (PIL, RGB) and its caption, "[image: WxH, mostly COLOUR]" (its size and dominant colour),
  takes the place of the prompt's next `<image>` (`tritongate/demo_models/images.py`): the model cannot see,
  but its answer shows the image reached it. A file that does not decode fails the request.
- `stream`: each response holds, per sequence, the text generated since the previous response (held
  back while it could be the start of a stop string, as vLLM does); the prompt never (asking for it with
  `exclude_input_in_output` = false is an error). Without `stream`: one response, the prompt prepended
  unless `exclude_input_in_output`. The response that ends the last sequence carries FINAL.
- Optional outputs, each only when its `return_*` input is true: `finish_reason` ("stop", "length", or
  "None" while running), `cumulative_logprob`, `logprobs` (JSON `[{token_id: {logprob, rank,
  decoded_token}}]` for the new positions, or "null" without `logprobs`), `num_input_tokens` (a scalar,
  UINT32) and `num_output_tokens` (per sequence, tokens since the previous response).
- Not the vLLM backend's: `return_prompt_logprobs` (with `prompt_logprobs` k in `sampling_parameters`)
  adds `prompt_logprobs` to the first response: vLLM's PromptLogprobs as JSON, `null` for the first prompt
  position, then per position `{token_id: {logprob, rank, decoded_token}}`, the prompt's token first, then
  the k most likely (at most parameter `max_logprobs`).
- `n` > 1: one element per sequence in every output.
- Cancellation ends the request: streaming, with a CANCELLED error response ("Request was cancelled").
- Errors: one error response "Error generating stream: ..." with `text_output` ["N/A"]; a request refused
  before generating says INVALID_ARG (the real backend says INTERNAL for every error).
"""

import json
from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from tritongate.demo_models.images import with_captions
from tritongate.demo_models.llm_core import Owner, Sequence, load_engine
from tritongate.demo_models.llm_sampling import Sampling
from tritongate.demo_models.llm_text import IncrementalDecoder, load_tokenizer

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
SAMPLING_EPS = 1e-5
# SamplingParams fields and the type the backend converts a value to (None: used as given).
FIELDS = {
    "n": int, "best_of": int, "presence_penalty": float, "frequency_penalty": float, "repetition_penalty": float,
    "temperature": float, "top_p": float, "top_k": int, "min_p": float, "seed": int, "stop": None,
    "stop_token_ids": None, "bad_words": None, "ignore_eos": bool, "max_tokens": int, "min_tokens": int,
    "logprobs": int, "prompt_logprobs": int, "detokenize": bool, "skip_special_tokens": bool,
    "spaces_between_special_tokens": bool, "include_stop_str_in_output": bool, "logit_bias": None,
    "allowed_token_ids": None, "truncate_prompt_tokens": None, "structured_outputs": None, "guided_decoding": None,
}
DEFAULTS = {
    "n": 1, "best_of": None, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
    "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None, "stop": [], "stop_token_ids": [],
    "bad_words": [], "ignore_eos": False, "max_tokens": 16, "min_tokens": 0, "logprobs": None,
    "prompt_logprobs": None, "detokenize": True, "skip_special_tokens": True, "spaces_between_special_tokens": True,
    "include_stop_str_in_output": False, "logit_bias": None, "allowed_token_ids": None,
    "truncate_prompt_tokens": None, "structured_outputs": None, "guided_decoding": None,
}


class Params:
    """SamplingParams, parsed and checked as vLLM does."""

    def __init__(self, text, max_logprobs):
        given = json.loads(text or "{}")
        if not isinstance(given, dict):
            raise ValueError("sampling_parameters must be a JSON object")
        given = {key: value for key, value in given.items() if value is not None}
        for key, value in given.items():
            if key not in FIELDS:
                raise ValueError(f"SamplingParams got an unexpected keyword argument {key!r}")
            if FIELDS[key] is not None:
                given[key] = FIELDS[key](value)
        for key, value in {**DEFAULTS, **given}.items():
            setattr(self, key, value)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.seed == -1:
            self.seed = None
        self._check(max_logprobs)
        if self.temperature < SAMPLING_EPS:  # greedy
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    def _check(self, max_logprobs):
        checks = [
            (self.n >= 1, f"n must be at least 1, got {self.n}."),
            (self.best_of in (None, self.n), "best_of is not supported by this demo model"),
            (-2.0 <= self.presence_penalty <= 2.0,
             f"presence_penalty must be in [-2, 2], got {self.presence_penalty}."),
            (-2.0 <= self.frequency_penalty <= 2.0,
             f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}."),
            (self.repetition_penalty > 0.0,
             f"repetition_penalty must be greater than zero, got {self.repetition_penalty}."),
            (self.temperature >= 0.0, f"temperature must be non-negative, got {self.temperature}."),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}."),
            (self.top_k >= -1, f"top_k must be 0 (disable), or at least 1, got {self.top_k}."),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}."),
            (self.max_tokens >= 1, f"max_tokens must be at least 1, got {self.max_tokens}."),
            (self.min_tokens >= 0, f"min_tokens must be greater than or equal to 0, got {self.min_tokens}."),
            (self.min_tokens <= self.max_tokens,
             f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}."),
            (self.logprobs is None or self.logprobs >= 0, f"logprobs must be non-negative, got {self.logprobs}."),
            (self.logprobs is None or self.logprobs <= max_logprobs,
             f"Requested sample logprobs of {self.logprobs}, which is greater than max allowed: {max_logprobs}"),
            (isinstance(self.stop, list) and all(isinstance(s, str) for s in self.stop),
             "stop must be a string or a list of strings"),
            ("" not in self.stop, "stop cannot contain an empty string."),
            (self.prompt_logprobs is None or self.prompt_logprobs >= 0,
             f"prompt_logprobs must be non-negative, got {self.prompt_logprobs}."),
            (self.prompt_logprobs is None or self.prompt_logprobs <= max_logprobs,
             f"Requested prompt logprobs of {self.prompt_logprobs}, which is greater than max allowed: "
             f"{max_logprobs}"),
            (self.allowed_token_ids is None or len(self.allowed_token_ids) > 0, "Empty allowed_token_ids provided"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def guide(self):
        """The structured-outputs constraint as (guide type, guide) for the engine, or None. vLLM 0.11+
        reads `structured_outputs` (StructuredOutputsParams as a JSON string), earlier ones
        `guided_decoding` (GuidedDecodingParams); the fields are the same."""
        given = self.structured_outputs if self.structured_outputs is not None else self.guided_decoding
        if given is None:
            return None
        fields = json.loads(given) if isinstance(given, str) else given
        if not isinstance(fields, dict):
            raise ValueError("structured_outputs must be a JSON object of StructuredOutputsParams fields")
        kinds = {"json": "json_schema", "json_object": "json", "regex": "regex", "choice": "choice",
                 "grammar": "ebnf_grammar"}
        unknown = [key for key in fields if key not in kinds and key not in ("backend", "whitespace_pattern")]
        if unknown:
            raise ValueError(f"StructuredOutputsParams got an unexpected keyword argument {unknown[0]!r}")
        used = [key for key in kinds if fields.get(key) not in (None, False)]
        if len(used) != 1:
            raise ValueError("You must use one kind of structured outputs constraint but none or several are "
                             f"specified: {used}")
        value = fields[used[0]]
        if used[0] in ("json", "choice") and not isinstance(value, str):
            value = json.dumps(value)
        return kinds[used[0]], "" if used[0] == "json_object" else value

    def sampling(self, engine, tokenizer, max_new, index, logprobs):
        vocab = engine.vocab_size
        bias = None
        if self.logit_bias:
            bias = np.zeros(vocab, dtype=np.float32)
            for token, value in self.logit_bias.items():
                if not 0 <= int(token) < vocab:
                    raise ValueError(f"token_id(s) [{token}] in logit_bias contain out-of-vocab token ids. "
                                     f"Vocabulary size: {vocab}")
                bias[int(token)] = min(max(float(value), -100.0), 100.0)
        if self.allowed_token_ids is not None and not all(0 <= int(t) < vocab for t in self.allowed_token_ids):
            raise ValueError("allowed_token_ids contains out-of-vocab token id!")
        bad_words = []
        for word in self.bad_words:  # as vLLM: the word as given and with a leading space
            for variant in (word, " " + word.lstrip()):
                ids = tokenizer.encode(variant, add_special_tokens=False)
                if ids and ids not in bad_words:
                    bad_words.append(ids)
        end_ids = tuple(int(t) for t in self.stop_token_ids) + (() if self.ignore_eos else (engine.eos_id,))
        return Sampling(
            max_new_tokens=max_new, greedy=self.temperature < SAMPLING_EPS, temperature=self.temperature,
            top_k=max(self.top_k, 0), top_p=self.top_p, min_p=self.min_p,
            seed=None if self.seed is None else self.seed + index, repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            min_tokens=self.min_tokens, end_ids=end_ids, bad_words=bad_words, bias=bias,
            allowed_ids=None if self.allowed_token_ids is None else [int(t) for t in self.allowed_token_ids],
            logprobs=logprobs, top_logprobs=self.logprobs or 0,
            grammar=None if self.guide() is None else engine.compile_guide(*self.guide()),
            context_logits=self.prompt_logprobs is not None,
        )


class Output:
    """One sequence's text and what of it has been sent."""

    def __init__(self, decoder):
        self.decoder, self.text, self.finish = decoder, "", None
        self.sent_text = self.sent_tokens = self.sent_logprobs = 0


@dataclass
class Inputs:
    """What one request asks for, read from its input tensors."""

    prompt: str
    prompt_ids: list
    params: Params
    stream: bool
    prepend: bool  # the prompt goes before the text (not streamed, unless exclude_input_in_output)
    returns: dict  # each optional output's `return_*` input → whether it is sent
    max_new: int  # most tokens each sequence may generate


class Request(Owner):
    """One request: its n sequences and their responses."""

    def __init__(self, model, request, inputs):
        self.model, self.request, self.sender = model, request, request.get_response_sender()
        self.request_id = request.request_id()
        params = inputs.params
        self.prompt, self.params, self.stream, self.prepend, self.returns = (
            inputs.prompt, params, inputs.stream, inputs.prepend, inputs.returns)
        self.outputs = [Output(IncrementalDecoder(model.tokenizer, params.skip_special_tokens))
                        for _ in range(params.n)]
        logprobs = params.logprobs is not None or self.returns["return_cumulative_logprob"]
        self.seqs = [Sequence(inputs.prompt_ids,
                              params.sampling(model.engine, model.tokenizer, inputs.max_new, i, logprobs), self,
                              index=i) for i in range(params.n)]
        self.stop_buffer = 0
        if params.stop and not params.include_stop_str_in_output:
            self.stop_buffer = max(len(s) for s in params.stop) - 1
        self.open, self.done = params.n, False
        self.sent_prompt = False

    def aborted(self):
        if self.done:
            return "failed"
        return "cancelled" if self.request.is_cancelled() else None

    def on_token(self, seq, reason):
        out, p = self.outputs[seq.index], self.params
        if p.detokenize:
            stop_token = reason == "stop" and seq.tokens[-1] in seq.sampling.end_ids
            before = len(out.text)
            if not stop_token or p.include_stop_str_in_output:
                out.text += out.decoder.add([seq.tokens[-1]])
            if reason is not None:
                out.text += out.decoder.flush()
            if p.stop and seq.generated > p.min_tokens and len(out.text) > before:
                reason = self._stop_string(out, len(out.text) - before) or reason
        if reason is not None:
            out.finish = reason
            self.open -= 1
        if self.stream or self.open == 0:
            self._send(final=self.open == 0)
        return reason

    def on_abort(self, seq, why):
        if self.done or why == "failed":
            return
        self.done = True
        if why == "unloading":
            self.sender.send(flags=FINAL)
        elif self.stream:
            error = pb_utils.TritonError("Request was cancelled", pb_utils.TritonError.CANCELLED)
            self.sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
        else:  # the backend sends what it has
            self._send(final=True)

    def on_error(self, seq, message):
        if not self.done:
            self.done = True
            self.model.respond_error(self.sender, f"Error generating stream: {message}")

    def _stop_string(self, out, new_chars):
        """vLLM's check_stop_strings: look for each stop string where the new characters could complete it."""
        for stop in self.params.stop:
            index = out.text.find(stop, max(0, len(out.text) - new_chars - len(stop) + 1))
            if index == -1:
                continue
            if self.params.include_stop_str_in_output:
                index = min(index + len(stop), len(out.text))
            out.text = out.text[:index]
            return "stop"
        return None

    def _send(self, final):
        texts, logprobs, counts = [], [], []
        for out, seq in zip(self.outputs, self.seqs, strict=True):
            if self.stream:
                end = len(out.text) - (0 if out.finish else self.stop_buffer)
                texts.append(out.text[out.sent_text:end] if end > out.sent_text else "")
                out.sent_text = max(out.sent_text, end)
            else:
                texts.append((self.prompt if self.prepend else "") + out.text)
            logprobs.append(self._logprobs(out, seq))
            counts.append(seq.generated - out.sent_tokens)
            out.sent_tokens = seq.generated
        tensors = [pb_utils.Tensor("text_output", np.asarray([t.encode("utf-8") for t in texts], dtype=np.object_))]
        if self.returns["return_finish_reason"]:
            reasons = [str(out.finish) for out in self.outputs]
            tensors.append(pb_utils.Tensor("finish_reason", np.asarray(reasons, dtype=np.object_)))
        if self.returns["return_cumulative_logprob"]:
            cumulative = [sum(seq.logprobs) for seq in self.seqs]
            tensors.append(pb_utils.Tensor("cumulative_logprob", np.asarray(cumulative, dtype=np.float32)))
        if self.returns["return_logprobs"]:
            tensors.append(pb_utils.Tensor("logprobs", np.asarray(logprobs, dtype=np.object_)))
        if self.returns["return_num_input_tokens"]:
            count = len(self.seqs[0].prompt)
            tensors.append(pb_utils.Tensor("num_input_tokens", np.asarray(count, dtype=np.uint32)))
        if self.returns["return_num_output_tokens"]:
            tensors.append(pb_utils.Tensor("num_output_tokens", np.asarray(counts, dtype=np.uint32)))
        if self.returns["return_prompt_logprobs"] and not self.sent_prompt:
            self.sent_prompt = True
            prompt = [self._prompt_logprobs(seq) for seq in self.seqs]
            tensors.append(pb_utils.Tensor("prompt_logprobs", np.asarray(prompt, dtype=np.object_)))
        if final:
            self.done = True
        self.sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=FINAL if final else 0)

    def _prompt_logprobs(self, seq):
        """vLLM's PromptLogprobs of `seq`'s prompt, from its context logits, as JSON."""
        if seq.context_logits is None:
            return b"null"
        import torch

        decode = self.model.tokenizer.decode
        log_probs = torch.log_softmax(seq.context_logits[:-1].double(), dim=-1)
        positions = [None]
        for row, token in zip(log_probs, seq.prompt[1:], strict=True):
            entry = {token: (float(row[token]), int((row > row[token]).sum()) + 1)}
            if self.params.prompt_logprobs:
                values, ids = torch.topk(row, self.params.prompt_logprobs)
                for rank, (alternative, value) in enumerate(zip(ids.tolist(), values.tolist(), strict=True), 1):
                    entry.setdefault(alternative, (value, rank))
            positions.append({str(t): {"logprob": v, "rank": r, "decoded_token": decode([t])}
                              for t, (v, r) in entry.items()})
        return json.dumps(positions).encode("utf-8")

    def _logprobs(self, out, seq):
        if self.params.logprobs is None:
            return b"null"
        positions = []
        for i in range(out.sent_logprobs, seq.generated):
            token = seq.tokens[len(seq.prompt) + i]
            entry = {token: (seq.logprobs[i], seq.ranks[i])}
            for rank, (alternative, value) in enumerate(seq.top[i] if seq.top else [], start=1):
                entry.setdefault(alternative, (value, rank))
            positions.append({str(t): {"logprob": v, "rank": r, "decoded_token": self.model.tokenizer.decode([t])}
                              for t, (v, r) in entry.items()})
        out.sent_logprobs = seq.generated
        return json.dumps(positions).encode("utf-8")


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = args["model_name"]
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(
                "vLLM Triton backend must be configured to use decoupled model transaction policy")
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.max_logprobs = int(params.get("max_logprobs") or 20)
        try:
            self.engine = load_engine(self.name, params, pb_utils.Logger.log_info, args)
            self.tokenizer = load_tokenizer()
        except (RuntimeError, ValueError) as exc:  # no weights, or an unusable device or dtype
            raise pb_utils.TritonModelException(f"{self.name}: {exc}") from exc

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                owner = self._parse(request)
            except LoraError as exc:
                self.respond_error(sender, str(exc), text=str(exc))
                continue
            except Exception as exc:  # the request's values, refused before generating: INVALID_ARG
                self.respond_error(sender, f"Error generating stream: {exc}", code=pb_utils.TritonError.INVALID_ARG)
                continue
            self.engine.submit(owner.seqs)
        return None

    def finalize(self):
        self.engine.close()

    def respond_error(self, sender, message, text="N/A", code=None):
        """The backend's error response; INTERNAL unless `code` says otherwise (the real backend sends every
        error so: the demo's refusals say INVALID_ARG, which the llm service tells apart without it too)."""
        output = pb_utils.Tensor("text_output", np.asarray([text.encode("utf-8")], dtype=np.object_))
        error = pb_utils.TritonError(message, pb_utils.TritonError.INTERNAL if code is None else code)
        sender.send(pb_utils.InferenceResponse(output_tensors=[output], error=error), flags=FINAL)

    def _parse(self, request):
        def tensor(name):
            found = pb_utils.get_input_tensor_by_name(request, name)
            return None if found is None else found.as_numpy().reshape(-1)

        if tensor("embedding_request") is not None:
            raise ValueError(f"Model {self.name} does not support 'embed' request")
        parameters = tensor("sampling_parameters")
        text = parameters[0].decode("utf-8") if parameters is not None else request.parameters()
        if json.loads(text or "{}").get("lora_name") is not None:
            raise LoraError("LoRA feature is not enabled.")
        prompt = tensor("text_input")[0]
        prompt = prompt.decode("utf-8") if isinstance(prompt, bytes) else str(prompt)
        images = tensor("image")
        if images is not None:  # each image's caption where the prompt places it
            prompt = with_captions(prompt, list(images))
        stream = tensor("stream")
        stream = bool(stream[0]) if stream is not None else False
        exclude = tensor("exclude_input_in_output")
        prepend = not bool(exclude[0]) if exclude is not None else not stream
        if prepend and stream:
            raise ValueError("When streaming, `exclude_input_in_output` = False is not allowed.")
        returns = {}
        for name in ("return_finish_reason", "return_cumulative_logprob", "return_logprobs",
                     "return_num_input_tokens", "return_num_output_tokens", "return_prompt_logprobs"):
            value = tensor(name)
            returns[name] = bool(value[0]) if value is not None else False
        params = Params(text, self.max_logprobs)
        prompt_ids = self.tokenizer.encode(prompt)
        if params.truncate_prompt_tokens is not None:
            prompt_ids = prompt_ids[-int(params.truncate_prompt_tokens):]
        if not prompt_ids:
            raise ValueError("The decoder prompt cannot be empty")
        max_new = min(params.max_tokens, self.engine.max_positions - len(prompt_ids))
        if max_new < 1:
            raise ValueError(f"The decoder prompt (length {len(prompt_ids)}) is longer than the maximum model "
                             f"length of {self.engine.max_positions}.")
        return Request(self, request, Inputs(prompt, prompt_ids, params, stream, prepend, returns, max_new))


class LoraError(Exception):
    """A request for a LoRA adapter: the backend answers before generating."""
