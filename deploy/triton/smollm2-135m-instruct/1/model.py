import os, sys
_site = os.environ.get("TRITONGATE_SITE_PACKAGES")
if _site:  # the Python-backend stub runs the base interpreter; use the venv's packages first
    sys.path.insert(0, _site)

"""SmolLM2-135M-Instruct on CPU behind the FasterTransformer (FT) tensor interface, decoupled.

Streaming follows FT's decoupled mode exactly: one response per generated token, each carrying the
WHOLE sequence so far (prompt included) in `output_ids` [batch, beam, width] with the valid length in
`sequence_length` [batch, beam]. Like FT, `width` is prompt_len + request_output_len in every
response (the buffer FT allocates once); positions past `sequence_length` hold padding (here the
end id) and must be ignored. Set the parameter `output_ids_width: "sequence"` to trim instead.

Like FT, the response that carries the last token is the one flagged
TRITONSERVER_RESPONSE_COMPLETE_FINAL (FT streams every step but the last through its callback and
sends the final output tensors with the FINAL flag), so a client sees exactly one response per
generated token. Unlike FT, a cancelled request stops generating at the next token: it ends with
an empty FINAL response.

Semantics, as FT: the end id and stop words stay in the output and count in `sequence_length`
(a stop word must lie within the generated tokens); no `random_seed` means seed 0; greedy unless
`runtime_top_k` > 1 or `runtime_top_p` > 0 (and `temperature` > 0). Beam search is not supported (`beam_width` must be 1); `len_penalty`,
`beam_search_diversity_rate` and `start_id` are accepted and ignored.

The weights are the folder fetch_smollm2 (tritongate.demo_models.smollm2) writes, read from
$TRITONGATE_MODELS_DIR/smollm2-135m-instruct.
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

MODEL_FOLDER = "smollm2-135m-instruct"
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class RequestError(Exception):
    """A bad request: reported to the client as an error response."""


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
    ids, offsets = arr[0, 0], arr[0, 1]
    words, start = [], 0
    for end in offsets:
        end = int(end)
        if end < 0:
            break
        if end > start:
            words.append([int(t) for t in ids[start:end]])
        start = end
    return words


class GenParams:
    """One request's inputs, parsed and validated in execute() so errors come back at once."""

    def __init__(self, request, default_end_id, max_positions):
        ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
        if ids.ndim == 1:
            ids = ids[None]
        if ids.shape[0] != 1:
            raise RequestError(f"batch size must be 1, got {ids.shape[0]}")
        length = _scalar(request, "input_lengths", ids.shape[1], int)
        if not 0 < length <= ids.shape[1]:
            raise RequestError(f"input_lengths={length} but input_ids holds {ids.shape[1]} ids")
        self.prompt = [int(t) for t in ids[0, :length]]
        self.max_new = _scalar(request, "request_output_len", 0, int)
        if len(self.prompt) + self.max_new > max_positions:
            raise RequestError(
                f"prompt ({len(self.prompt)}) + request_output_len ({self.max_new}) exceeds the "
                f"model's {max_positions} positions"
            )
        self.top_k = _scalar(request, "runtime_top_k", 0, int)
        self.top_p = _scalar(request, "runtime_top_p", 0.0, float)
        self.temperature = _scalar(request, "temperature", 1.0, float)
        self.repetition_penalty = _scalar(request, "repetition_penalty", 1.0, float)
        self.presence_penalty = _scalar(request, "presence_penalty", 0.0, float)
        self.seed = _scalar(request, "random_seed", 0, int)
        self.log_probs = _scalar(request, "is_return_log_probs", False, bool)
        beam_width = _scalar(request, "beam_width", 1, int)
        if beam_width != 1:
            raise RequestError(f"beam_width={beam_width}: this model supports 1 only")
        self.end_id = _scalar(request, "end_id", default_end_id, int)
        self.stop_words = _words(request, "stop_words_list")
        self.bad_words = _words(request, "bad_words_list")
        self.greedy = (
            self.temperature <= 0.0
            or self.top_k == 1
            or (self.top_k == 0 and self.top_p <= 0.0)
        )


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(f"{MODEL_FOLDER} must be decoupled")
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.name = args["model_name"]
        self.trim_output = params.get("output_ids_width", "request") == "sequence"

        models_dir = os.environ.get("TRITONGATE_MODELS_DIR", "")
        path = os.path.join(models_dir, MODEL_FOLDER)
        if not models_dir or not os.path.isfile(os.path.join(path, "config.json")):
            raise pb_utils.TritonModelException(
                f"{self.name}: no converted model at {path!r} (TRITONGATE_MODELS_DIR="
                f"{models_dir!r}); create it with tritongate.demo_models.smollm2.fetch_smollm2"
            )

        import torch
        from transformers import AutoModelForCausalLM, DynamicCache

        self.threads_per_request = int(params.get("torch_threads", "1") or 1)
        torch.set_num_threads(self.threads_per_request)
        dtype = getattr(torch, params.get("dtype", "bfloat16") or "bfloat16")
        started = time.monotonic()
        self.torch, self.DynamicCache = torch, DynamicCache
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.model.config.eos_token_id
        self.default_end_id = int(eos[0] if isinstance(eos, (list, tuple)) else eos)
        self.max_positions = int(self.model.config.max_position_embeddings)
        with torch.inference_mode():  # warm up, so the first request is not the slow one
            self.model(input_ids=torch.tensor([[self.default_end_id]]), use_cache=False)
        self.lock = threading.Lock()
        self.threads = set()
        self.stopping = threading.Event()
        pb_utils.Logger.log_info(
            f"{self.name}: loaded {path} ({dtype}, end id {self.default_end_id}) "
            f"in {time.monotonic() - started:.1f} s"
        )

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                gen = GenParams(request, self.default_end_id, self.max_positions)
            except RequestError as exc:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=FINAL)
                continue
            thread = threading.Thread(target=self._run, args=(request, sender, gen), daemon=True)
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

    # --- one request, on its own thread -------------------------------------------------------

    def _run(self, request, sender, gen):
        try:
            # OpenMP's thread count is per native thread: set it in each worker, not only once.
            self.torch.set_num_threads(self.threads_per_request)
            with self.torch.inference_mode():
                self._generate(request, sender, gen)
        except Exception as exc:  # report, never leave the stream open
            pb_utils.Logger.log_error(f"{self.name}: generation failed: {exc!r}")
            try:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(repr(exc))), flags=FINAL)
            except Exception:
                pass
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())

    def _generate(self, request, sender, gen):
        torch = self.torch
        tokens = list(gen.prompt)
        log_probs = []
        if gen.max_new <= 0:
            sender.send(self._response(gen, tokens, log_probs), flags=FINAL)
            return
        generator = torch.Generator().manual_seed(gen.seed)
        cache = self.DynamicCache(config=self.model.config)
        next_input = torch.tensor([tokens], dtype=torch.long)
        for step in range(gen.max_new):
            if self.stopping.is_set() or request.is_cancelled():
                pb_utils.Logger.log_info(
                    f"{self.name}: request {request.request_id()!r} cancelled after {step} tokens"
                )
                sender.send(flags=FINAL)
                return
            logits = self.model(input_ids=next_input, past_key_values=cache, use_cache=True).logits
            token, log_prob = self._choose(logits[0, -1].float(), tokens, gen, generator)
            tokens.append(token)
            if gen.log_probs:
                log_probs.append(log_prob)
            done = step + 1 == gen.max_new or token == gen.end_id or _ends_with_any(tokens[len(gen.prompt):], gen.stop_words)
            sender.send(self._response(gen, tokens, log_probs), flags=FINAL if done else 0)
            if done:
                return
            next_input = torch.tensor([[token]], dtype=torch.long)

    def _choose(self, logits, tokens, gen, generator):
        torch = self.torch
        if gen.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(tokens)), dtype=torch.long)
            scores = logits[seen]
            logits[seen] = torch.where(
                scores < 0, scores * gen.repetition_penalty, scores / gen.repetition_penalty
            )
        if gen.presence_penalty != 0.0 and len(tokens) > len(gen.prompt):
            generated = torch.tensor(sorted(set(tokens[len(gen.prompt):])), dtype=torch.long)
            logits[generated] -= gen.presence_penalty
        for word in gen.bad_words:
            prefix = word[:-1]
            if len(prefix) <= len(tokens) and tokens[len(tokens) - len(prefix):] == prefix:
                if 0 <= word[-1] < logits.shape[0]:
                    logits[word[-1]] = float("-inf")
        if not gen.greedy:
            logits = logits / gen.temperature
        log_softmax = torch.log_softmax(logits, dim=-1) if gen.log_probs else None
        if gen.greedy:
            token = int(torch.argmax(logits))
        else:
            token = _sample(torch, logits, gen.top_k, gen.top_p, generator)
        return token, (float(log_softmax[token]) if log_softmax is not None else 0.0)

    def _response(self, gen, tokens, log_probs):
        width = len(tokens) if self.trim_output else len(gen.prompt) + gen.max_new
        output_ids = np.full((1, 1, width), gen.end_id & 0xFFFFFFFF, dtype=np.uint32)
        output_ids[0, 0, : len(tokens)] = tokens
        outputs = [
            pb_utils.Tensor("output_ids", output_ids),
            pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.uint32)),
            pb_utils.Tensor("response_input_lengths", np.array([[len(gen.prompt)]], dtype=np.int32)),
        ]
        if gen.log_probs:  # FT: [batch, beam, request_output_len] and [batch, beam]
            per_token = np.zeros((1, 1, max(gen.max_new, len(log_probs))), dtype=np.float32)
            per_token[0, 0, : len(log_probs)] = log_probs
            outputs.append(pb_utils.Tensor("output_log_probs", per_token))
            outputs.append(pb_utils.Tensor("cum_log_probs", np.array([[sum(log_probs)]], dtype=np.float32)))
        return pb_utils.InferenceResponse(output_tensors=outputs)


def _sample(torch, logits, top_k, top_p, generator):
    if 0 < top_k < logits.shape[0]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if 0.0 < top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        drop = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def _ends_with_any(tokens, words):
    return any(len(word) <= len(tokens) and tokens[-len(word):] == word for word in words)
