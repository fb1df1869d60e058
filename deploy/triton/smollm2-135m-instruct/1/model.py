import os, site, sys  # noqa: E401, I001  (must come first; see below)

_site = os.environ.get("TRITONGATE_SITE_PACKAGES")
if _site:  # the Python-backend stub runs the base interpreter: the venv's packages first, and its .pth
    sys.path.insert(0, _site)  # files (an editable install of tritongate) through site.addsitedir
    site.addsitedir(_site)

"""SmolLM2-135M-Instruct on CPU behind the FasterTransformer (FT) tensor interface, decoupled.

Streaming follows FT's decoupled mode: one response per generated token, each carrying the WHOLE
sequence so far (prompt included) in `output_ids` [batch, beam, width] with the valid length in
`sequence_length` [batch, beam]. Like FT, `width` is prompt_len + request_output_len in every
response (the buffer FT allocates once); positions past `sequence_length` hold padding (here the
end id) and must be ignored. Set the parameter `output_ids_width: "sequence"` to trim instead.

Like FT, the response that carries the last token is the one flagged
TRITONSERVER_RESPONSE_COMPLETE_FINAL (FT streams every step but the last through its callback and
sends the final output tensors with the FINAL flag), so a client sees exactly one response per
generated token. Unlike FT, a cancelled request stops at the next token and ends with an empty
FINAL response.

Semantics, as FT: the end id and stop words stay in the output and count in `sequence_length`
(a stop word must lie within the generated tokens); no `random_seed` means seed 0; greedy unless
`runtime_top_k` > 1 or `runtime_top_p` > 0 (and `temperature` > 0); `beam_search_diversity_rate` and
`start_id` are accepted and ignored.

Beam search, as FT: `beam_width` 2, 3 or 4 (up to the `max_beam_width` parameter; FT's other widths,
8, 16 and 32, are more than this model decodes at once and are refused; any width FT does not know runs
as 1, as FT does), scored by `len_penalty` (default 0: the cumulative log-probability). Every streamed
response carries every beam's whole sequence so far, `output_ids` [1, beam_width, width] and
`sequence_length` [1, beam_width], best first; the last (FINAL) one holds the search's result, best
first, which may differ from the beams streamed before it.

Not FT's (real FT has neither): TensorRT-LLM's `return_context_logits` and `return_generation_logits`.
With them the response that carries the first generated token has `context_logits` [1, prompt length,
vocab] (row i scores the token after prompt token i), and each response `generation_logits` [1, 1, new,
vocab] of the tokens new in it: the model's logits, FP32, before any sampling rule.

This file is the interface only; the generation (weights, batching, sampling, stopping,
cancellation) is the engine every demo LLM shares, tritongate/demo_models/llm_core.py.
"""

import contextlib
import json

import numpy as np
import triton_python_backend_utils as pb_utils

from tritongate.demo_models.llm_beams import beam_arrays
from tritongate.demo_models.llm_core import Owner, RequestError, Sequence, load_engine
from tritongate.demo_models.llm_sampling import Sampling

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _scalar(request, name, default, cast):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    values = tensor.as_numpy().reshape(-1)
    return cast(values[0]) if values.size else default


def _words(request, name):
    """FT word list [batch, 2, N] (row 0: ids concatenated, row 1: end offsets, -1 padded)."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return []
    arr = tensor.as_numpy()
    if arr.ndim == 2:  # tolerate a missing batch dimension
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[1] != 2:
        raise RequestError(f"{name} must have shape [batch, 2, N], got {list(arr.shape)}")
    words, start = [], 0
    for end in arr[0, 1]:
        end = int(end)
        if end < 0:
            break
        if end > start:
            words.append([int(t) for t in arr[0, 0, start:end]])
        start = end
    return words


FT_BEAM_WIDTHS = (1, 2, 3, 4, 8, 16, 32)  # ParallelGptTritonModelInstance.cc: any other width runs as 1


def parse(request, default_end_id, max_positions, max_beam_width):
    """The request's prompt and Sampling, validated in execute() so that errors come back at once."""
    ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
    if ids.ndim == 1:
        ids = ids[None]
    if ids.shape[0] != 1:
        raise RequestError(f"batch size must be 1, got {ids.shape[0]}")
    length = _scalar(request, "input_lengths", ids.shape[1], int)
    if not 0 < length <= ids.shape[1]:
        raise RequestError(f"input_lengths={length} but input_ids holds {ids.shape[1]} ids")
    prompt = [int(t) for t in ids[0, :length]]
    max_new = _scalar(request, "request_output_len", 0, int)
    if len(prompt) + max_new > max_positions:
        raise RequestError(
            f"prompt ({len(prompt)}) + request_output_len ({max_new}) exceeds the model's {max_positions} positions"
        )
    beam_width = _scalar(request, "beam_width", 1, int)
    beam_width = beam_width if beam_width in FT_BEAM_WIDTHS else 1
    if beam_width > max_beam_width:
        raise RequestError(f"beam_width={beam_width}: this model decodes at most {max_beam_width} beams")
    top_k = _scalar(request, "runtime_top_k", 0, int)
    top_p = _scalar(request, "runtime_top_p", 0.0, float)
    temperature = _scalar(request, "temperature", 1.0, float)
    sampling = Sampling(
        max_new_tokens=max_new,
        greedy=temperature <= 0.0 or top_k == 1 or (top_k == 0 and top_p <= 0.0),
        temperature=temperature, top_k=top_k, top_p=top_p if 0.0 < top_p < 1.0 else 1.0,
        seed=_scalar(request, "random_seed", 0, int),
        repetition_penalty=_scalar(request, "repetition_penalty", 1.0, float),
        presence_penalty=_scalar(request, "presence_penalty", 0.0, float),
        end_ids=(_scalar(request, "end_id", default_end_id, int),),
        stop_words=_words(request, "stop_words_list"), bad_words=_words(request, "bad_words_list"),
        logprobs=_scalar(request, "is_return_log_probs", False, bool),
        beam_width=beam_width, length_penalty=_scalar(request, "len_penalty", 0.0, float),
        context_logits=_scalar(request, "return_context_logits", False, bool),
        generation_logits=_scalar(request, "return_generation_logits", False, bool),
    )
    if beam_width > 1 and (sampling.context_logits or sampling.generation_logits):
        raise RequestError("return_context_logits and return_generation_logits cannot be combined with beam "
                           "search (beam_width > 1) in this demo model")
    return prompt, sampling


def logit_tensors(seq):
    """The context logits once (then dropped), and the generation logits not sent yet (then dropped)."""
    tensors = []
    if seq.context_logits is not None:
        tensors.append(pb_utils.Tensor("context_logits", seq.context_logits.numpy()[None]))
        seq.context_logits = None
    if seq.generation_logits:
        rows = np.stack([row.numpy() for row in seq.generation_logits])
        tensors.append(pb_utils.Tensor("generation_logits", rows[None, None]))
        seq.generation_logits.clear()
    return tensors


class Request(Owner):
    """One request: a response per token, each with the whole sequence so far."""

    def __init__(self, request, trim_output):
        self.request, self.sender, self.trim_output = request, request.get_response_sender(), trim_output
        self.request_id = request.request_id()

    def aborted(self):
        return "cancelled" if self.request.is_cancelled() else None

    def on_token(self, seq, reason):
        self.sender.send(self.response(seq), flags=FINAL if reason is not None else 0)
        return reason

    def on_abort(self, seq, why):
        self.sender.send(flags=FINAL)

    def on_error(self, seq, message):
        self.sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)

    def on_beams(self, search):
        seq, s = search.request, search.request.sampling
        width = None if self.trim_output else len(seq.prompt) + s.max_new_tokens
        arrays = beam_arrays(search.best(), s.beam_width, prefix=seq.prompt, keep_end=True, end_ids=s.end_ids,
                             pad=s.end_ids[0] & 0xFFFFFFFF, width=width)
        outputs = [
            pb_utils.Tensor("output_ids", arrays["output_ids"].astype(np.uint32)),
            pb_utils.Tensor("sequence_length", arrays["sequence_length"].astype(np.uint32)),
            pb_utils.Tensor("response_input_lengths", np.full((1, s.beam_width), len(seq.prompt), dtype=np.int32)),
        ]
        if s.logprobs:
            outputs.append(pb_utils.Tensor("output_log_probs", arrays["output_log_probs"][:, :, : s.max_new_tokens]))
            outputs.append(pb_utils.Tensor("cum_log_probs", arrays["cum_log_probs"]))
        self.sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=FINAL if search.done else 0)

    def response(self, seq):
        s, tokens = seq.sampling, seq.tokens
        width = len(tokens) if self.trim_output else len(seq.prompt) + s.max_new_tokens
        output_ids = np.full((1, 1, width), s.end_ids[0] & 0xFFFFFFFF, dtype=np.uint32)
        output_ids[0, 0, : len(tokens)] = tokens
        outputs = [
            pb_utils.Tensor("output_ids", output_ids),
            pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.uint32)),
            pb_utils.Tensor("response_input_lengths", np.array([[len(seq.prompt)]], dtype=np.int32)),
        ]
        if s.logprobs:  # FT: [batch, beam, request_output_len] and [batch, beam]
            per_token = np.zeros((1, 1, s.max_new_tokens), dtype=np.float32)
            per_token[0, 0, : len(seq.logprobs)] = seq.logprobs
            outputs.append(pb_utils.Tensor("output_log_probs", per_token))
            outputs.append(pb_utils.Tensor("cum_log_probs", np.array([[sum(seq.logprobs)]], dtype=np.float32)))
        outputs += logit_tensors(seq)
        return pb_utils.InferenceResponse(output_tensors=outputs)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = args["model_name"]
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(f"{self.name} must be decoupled")
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.trim_output = params.get("output_ids_width", "request") == "sequence"
        self.max_beam_width = int(params.get("max_beam_width") or 1)
        try:
            self.engine = load_engine(self.name, params, pb_utils.Logger.log_info, args)
        except (RuntimeError, ValueError) as exc:  # no weights, or an unusable device or dtype
            raise pb_utils.TritonModelException(f"{self.name}: {exc}") from exc

    def execute(self, requests):
        for request in requests:
            owner = Request(request, self.trim_output)
            try:
                prompt, sampling = parse(request, self.engine.eos_id, self.engine.max_positions,
                                         self.max_beam_width)
            except RequestError as exc:  # refused before generating, in the words of FT's checks (INVALID_ARG,
                # which a stream does not carry: the llm service tells a refusal by those words there)
                error = pb_utils.TritonError(f"[FT][ERROR] {exc}", pb_utils.TritonError.INVALID_ARG)
                owner.sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            seq = Sequence(prompt, sampling, owner)
            if sampling.max_new_tokens <= 0:  # nothing to generate: the prompt, at once
                with contextlib.suppress(Exception):
                    owner.sender.send(owner.response(seq), flags=FINAL)
                continue
            self.engine.submit([seq])
        return None

    def finalize(self):
        self.engine.close()
