"""ft-echo: the echo (echo_core) on the FasterTransformer tensor interface, decoupled.

Generation stops (whichever comes first) after `request_output_len` tokens, at a token equal to
`end_id` (default: parameter `default_end_id`), or when the generated tokens end with one of
`stop_words_list`; the end id and stop words stay in the output and count in `sequence_length`, as
with FT. `bad_words_list` words are never completed.

Streaming is FT's: each response carries the whole sequence so far (prompt included) in `output_ids`
[1, 1, width] and its length in `sequence_length` [1, 1]; `width` is prompt_len + request_output_len
(FT's fixed buffer; padding = end id) unless the parameter `output_ids_width` is "sequence". Each
response adds `tokens_per_response` tokens (the last may add fewer) and the response with the last
tokens is the one flagged FINAL. With `is_return_log_probs`, `output_log_probs` [1, 1,
request_output_len] and `cum_log_probs` [1, 1] come too. A cancelled request ends with an empty FINAL
response and logs "ft-echo cancelled after N tokens".

Beam search: `beam_width` 2, 3, 4, 8, 16 or 32 (FT's widths; any other runs as 1, as FT does) makes that
many sequences, beam k the echo starting at prompt token k (echo_core), best first; every response holds
all beams ([1, beams, width], `sequence_length` [1, beams], log probs per beam).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from echo_core import Echo, EchoModel, Job, RequestError, log_prob, scalar, tensor


def word_list(request: Any, name: str) -> list[list[int]]:
    """FT word list [batch, 2, N] (row 0: ids concatenated, row 1: end offsets, -1 padded)."""
    arr = tensor(request, name)
    if arr is None:
        return []
    if arr.ndim == 2:
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


FT_BEAM_WIDTHS = (1, 2, 3, 4, 8, 16, 32)


@dataclass
class FtJob(Job):
    end_id: int = 0
    log_probs: bool = False


class FtEchoModel(EchoModel):
    def setup(self) -> None:
        self.default_end_id = int(self.param("default_end_id", "2"))
        self.trim_output = self.param("output_ids_width", "request") == "sequence"

    def parse(self, request: Any) -> Job:
        ids = tensor(request, "input_ids").reshape(1, -1)
        length = scalar(request, "input_lengths", ids.shape[1], int)
        if not 0 < length <= ids.shape[1]:
            raise RequestError(f"input_lengths={length} but input_ids holds {ids.shape[1]} ids")
        end_id = scalar(request, "end_id", self.default_end_id, int)
        beams = scalar(request, "beam_width", 1, int)
        beams = beams if beams in FT_BEAM_WIDTHS else 1
        echoes = [Echo(prompt=[int(t) for t in ids[0, :length]], max_new=scalar(request, "request_output_len", 0, int),
                       end_ids=frozenset([end_id]), stop_words=word_list(request, "stop_words_list"),
                       bad_words=word_list(request, "bad_words_list"), start=k) for k in range(beams)]
        return FtJob(request.request_id(), echoes, streaming=True, end_id=end_id,
                     log_probs=scalar(request, "is_return_log_probs", False, bool), **self.knobs(request))

    def respond(self, job: FtJob, done: bool) -> Any:
        beams = job.sequences
        prompt, max_new = beams[0].prompt, beams[0].max_new
        sequences = [prompt + echo.tokens for echo in beams]
        width = max(map(len, sequences)) if self.trim_output else len(prompt) + max_new
        output_ids = np.full((1, len(beams), width), job.end_id & 0xFFFFFFFF, dtype=np.uint32)
        for k, tokens in enumerate(sequences):
            output_ids[0, k, : len(tokens)] = tokens
        outputs = [
            pb_utils.Tensor("output_ids", output_ids),
            pb_utils.Tensor("sequence_length", np.array([[len(tokens) for tokens in sequences]], dtype=np.uint32)),
            pb_utils.Tensor("response_input_lengths", np.full((1, len(beams)), len(prompt), dtype=np.int32)),
        ]
        if job.log_probs:
            per_token = np.zeros((1, len(beams), max_new), dtype=np.float32)
            for k, echo in enumerate(beams):
                per_token[0, k, : len(echo.tokens)] = [log_prob(i, k) for i in range(len(echo.tokens))]
            outputs.append(pb_utils.Tensor("output_log_probs", per_token))
            outputs.append(pb_utils.Tensor("cum_log_probs", per_token.sum(axis=2)))
        return pb_utils.InferenceResponse(output_tensors=outputs)
