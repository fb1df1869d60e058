import os, sys  # noqa: E401, I001  (must come first; see below)

_site = os.environ.get("TRITONGATE_SITE_PACKAGES")
if _site:  # the Python-backend stub runs the base interpreter; use the venv's packages first
    sys.path.insert(0, _site)

"""ft-echo: a deterministic decoupled model on the FasterTransformer tensor interface, for tests.

The continuation echoes the prompt: generated token i is prompt[i % len(prompt)], after dropping
the single-token `bad_words_list` entries from the cycle. Generation stops (whichever comes first)
after `request_output_len` tokens, at a token equal to `end_id` (default: parameter
`default_end_id`), or when the generated tokens end with one of `stop_words_list` (a match
may not reach into the prompt); the end id and stop words stay in the output and count in
`sequence_length`, as with FT.

Streaming is FT's: each response carries the whole sequence so far (prompt included) in
`output_ids` [1, 1, width] and its length in `sequence_length` [1, 1]; `width` is
prompt_len + request_output_len (FT's fixed buffer; padding = end id) unless the parameter
`output_ids_width` is "sequence". Each response adds `tokens_per_response` tokens (parameter,
overridable per request; the last may add fewer) and the response with the last tokens is the one
flagged FINAL. Test-only optional inputs: `tokens_per_response`, `delay_ms` (sleep before each
response), `error_after_tokens` (after that many tokens, end with an error response).

Cancellation is checked before each response; a cancelled request ends with an empty FINAL
response, logs "ft-echo cancelled after N tokens" and, if $TRITONGATE_TEST_EVENTS names a file,
appends {"event": "cancelled", ...} to it (one JSON object per line; "completed" and "error"
events are appended too).
"""

import contextlib
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_events_lock = threading.Lock()
# The Python-backend stub (Triton 2.51) crashes (segfaults in the stub) when several threads send
# responses or check cancellation at the same time, e.g. 64 concurrent streams or many streams
# cancelled at once: every call into the response sender and `is_cancelled` goes through this lock.
_backend_lock = threading.Lock()


def _send(sender, response=None, flags=0):
    with _backend_lock:
        if response is None:
            sender.send(flags=flags)
        else:
            sender.send(response, flags=flags)


def _is_cancelled(request):
    with _backend_lock:
        return request.is_cancelled()


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
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[1] != 2:
        raise ValueError(f"{name} must have shape [batch, 2, N], got {list(arr.shape)}")
    words, start = [], 0
    for end in arr[0, 1]:
        end = int(end)
        if end < 0:
            break
        if end > start:
            words.append([int(t) for t in arr[0, 0, start:end]])
        start = end
    return words


def _event(**fields):
    path = os.environ.get("TRITONGATE_TEST_EVENTS")
    if not path:
        return
    with _events_lock, open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(fields) + "\n")


class Job:
    """One request, parsed up front so a bad request fails at once."""

    def __init__(self, request, params):
        ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(1, -1)
        length = _scalar(request, "input_lengths", ids.shape[1], int)
        if not 0 < length <= ids.shape[1]:
            raise ValueError(f"input_lengths={length} but input_ids holds {ids.shape[1]} ids")
        self.request_id = request.request_id()
        self.prompt = [int(t) for t in ids[0, :length]]
        self.max_new = _scalar(request, "request_output_len", 0, int)
        self.end_id = _scalar(request, "end_id", params["default_end_id"], int)
        self.per_response = max(1, _scalar(request, "tokens_per_response", params["tokens_per_response"], int))
        self.delay = _scalar(request, "delay_ms", 0, int) / 1000.0
        self.error_after = _scalar(request, "error_after_tokens", None, int)
        self.log_probs = _scalar(request, "is_return_log_probs", False, bool)
        self.stop_words = _words(request, "stop_words_list")
        banned = {w[0] for w in _words(request, "bad_words_list") if len(w) == 1}
        self.cycle = [t for t in self.prompt if t not in banned]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.params = {
            "default_end_id": int(params.get("default_end_id", "2")),
            "tokens_per_response": int(params.get("tokens_per_response", "1")),
        }
        self.trim_output = params.get("output_ids_width", "request") == "sequence"
        self.lock = threading.Lock()
        self.threads = set()
        self.stopping = threading.Event()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                job = Job(request, self.params)
            except ValueError as exc:
                _send(sender, pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), FINAL)
                continue
            thread = threading.Thread(target=self._run, args=(request, sender, job), daemon=True)
            with self.lock:
                self.threads.add(thread)
            thread.start()
        return None

    def finalize(self):
        self.stopping.set()
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=10)

    def _run(self, request, sender, job):
        try:
            self._stream(request, sender, job)
        except Exception as exc:
            pb_utils.Logger.log_error(f"ft-echo failed: {exc!r}")
            with contextlib.suppress(Exception):
                _send(sender, pb_utils.InferenceResponse(error=pb_utils.TritonError(repr(exc))), FINAL)
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())

    def _stream(self, request, sender, job):
        tokens = list(job.prompt)
        n = 0  # tokens generated so far
        limit = job.max_new if job.cycle else 0
        reason = "length"
        while True:
            if job.delay:
                time.sleep(job.delay)
            if self.stopping.is_set() or _is_cancelled(request):
                pb_utils.Logger.log_info(f"ft-echo cancelled after {n} tokens")
                _event(event="cancelled", model="ft-echo", request_id=job.request_id, tokens=n)
                _send(sender, flags=FINAL)
                return
            if job.error_after is not None and n >= job.error_after:
                _event(event="error", model="ft-echo", request_id=job.request_id, tokens=n)
                error = pb_utils.TritonError(f"ft-echo: injected error after {n} tokens")
                _send(sender, pb_utils.InferenceResponse(error=error), FINAL)
                return
            done = n >= limit
            chunk_end = n + job.per_response
            while not done and n < chunk_end:
                token = job.cycle[n % len(job.cycle)]
                tokens.append(token)
                n += 1
                if token == job.end_id:
                    done, reason = True, "end_id"
                elif any(w == tokens[len(tokens) - len(w) :] for w in job.stop_words if len(w) <= n):
                    done, reason = True, "stop_words"
                elif n >= limit:
                    done = True
            _send(sender, self._response(job, tokens), FINAL if done else 0)
            if done:
                _event(event="completed", model="ft-echo", request_id=job.request_id, tokens=n, reason=reason)
                return

    def _response(self, job, tokens):
        width = len(tokens) if self.trim_output else len(job.prompt) + job.max_new
        output_ids = np.full((1, 1, width), job.end_id & 0xFFFFFFFF, dtype=np.uint32)
        output_ids[0, 0, : len(tokens)] = tokens
        outputs = [
            pb_utils.Tensor("output_ids", output_ids),
            pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.uint32)),
            pb_utils.Tensor("response_input_lengths", np.array([[len(job.prompt)]], dtype=np.int32)),
        ]
        if job.log_probs:  # generated token i has log prob -0.1 * (i + 1)
            generated = len(tokens) - len(job.prompt)
            per_token = np.zeros((1, 1, job.max_new), dtype=np.float32)
            per_token[0, 0, :generated] = -0.1 * np.arange(1, generated + 1, dtype=np.float32)
            cum = np.array([[per_token[0, 0, :generated].sum()]], dtype=np.float32)
            outputs.append(pb_utils.Tensor("output_log_probs", per_token))
            outputs.append(pb_utils.Tensor("cum_log_probs", cum))
        return pb_utils.InferenceResponse(output_tensors=outputs)
