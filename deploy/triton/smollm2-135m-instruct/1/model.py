import os, sys  # noqa: E401, I001  (must come first; see below)

_site = os.environ.get("TRITONGATE_SITE_PACKAGES")
if _site:  # the Python-backend stub runs the base interpreter; use the venv's packages first
    sys.path.insert(0, _site)

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
`runtime_top_k` > 1 or `runtime_top_p` > 0 (and `temperature` > 0). Beam search is not supported
(`beam_width` must be 1); `len_penalty`, `beam_search_diversity_rate` and `start_id` are accepted
and ignored.

Scheduling: one worker thread owns the model. A new request's prompt is prefilled on its own, in
chunks of `prefill_chunk_tokens` interleaved with decoding steps, then the request joins the
running batch: every decoding step runs all active requests as one batch (left-padded KV cache),
which on this memory-bound CPU model costs little more than a single request. At most
`max_active_requests` run together; more wait in a queue. With bfloat16, a near-tie greedy choice
can differ between a request run alone and the same request batched with others (float32: same).

The weights are the folder fetch_smollm2 (tritongate.demo_models.smollm2) writes, read from
$TRITONGATE_MODELS_DIR/smollm2-135m-instruct.
"""

import contextlib
import json
import queue
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
    words, start = [], 0
    for end in arr[0, 1]:
        end = int(end)
        if end < 0:
            break
        if end > start:
            words.append([int(t) for t in arr[0, 0, start:end]])
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
        self.greedy = self.temperature <= 0.0 or self.top_k == 1 or (self.top_k == 0 and self.top_p <= 0.0)


class Sequence:
    """One request being generated."""

    def __init__(self, request, sender, gen):
        self.request, self.sender, self.gen = request, sender, gen
        self.tokens = list(gen.prompt)
        self.log_probs = []
        self.generator = None  # a torch.Generator, made on the worker thread
        self.cache = None  # its own KV cache while the prompt is prefilled

    @property
    def generated(self):
        return len(self.tokens) - len(self.gen.prompt)


class Batch:
    """The active sequences and their KV cache, left-padded to a common length.

    Row i holds `pads[i]` padding positions (masked out) followed by its real keys and values;
    every decoding step appends one position to every row.
    """

    def __init__(self, torch, cache_class, config):
        self.torch, self.cache_class, self.config = torch, cache_class, config
        self.seqs, self.pads, self.cache = [], [], None

    def add(self, seq, cache):
        """Join `seq` with its own prefilled batch-1 cache."""
        if not self.seqs:
            self.seqs, self.pads, self.cache = [seq], [0], cache
            return
        old, new = self.cache.get_seq_length(), cache.get_seq_length()
        width = max(old, new)
        layers = []
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            keys = self.torch.cat([self._pad(mine.keys, width - old), self._pad(theirs.keys, width - new)])
            values = self.torch.cat([self._pad(mine.values, width - old), self._pad(theirs.values, width - new)])
            layers.append((keys, values))
        self.cache = self.cache_class(ddp_cache_data=layers, config=self.config)
        self.pads = [p + width - old for p in self.pads] + [width - new]
        self.seqs.append(seq)

    def keep(self, rows):
        """Keep only `rows` (indices), dropping padding no remaining row needs."""
        if len(rows) == len(self.seqs):
            return
        self.seqs = [self.seqs[i] for i in rows]
        self.pads = [self.pads[i] for i in rows]
        if not rows:
            self.cache = None
            return
        index, trim = self.torch.tensor(rows), min(self.pads)
        layers = [(layer.keys[index, :, trim:], layer.values[index, :, trim:]) for layer in self.cache.layers]
        self.cache = self.cache_class(ddp_cache_data=layers, config=self.config)
        self.pads = [p - trim for p in self.pads]

    def step(self, model):
        """One decoding step for every row; returns the last-position logits [rows, vocab]."""
        torch, length = self.torch, self.cache.get_seq_length()
        input_ids = torch.tensor([[seq.tokens[-1]] for seq in self.seqs])
        mask = torch.ones(len(self.seqs), length + 1, dtype=torch.long)
        for row, pad in enumerate(self.pads):
            mask[row, :pad] = 0
        positions = torch.tensor([[length - pad] for pad in self.pads])
        out = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
        )
        return out.logits[:, -1].float()

    def _pad(self, tensor, n):
        if n == 0:
            return tensor
        shape = list(tensor.shape)
        shape[-2] = n
        return self.torch.cat([tensor.new_zeros(shape), tensor], dim=-2)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(f"{MODEL_FOLDER} must be decoupled")
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.name = args["model_name"]
        self.trim_output = params.get("output_ids_width", "request") == "sequence"
        self.max_active = int(params.get("max_active_requests") or 8)
        self.prefill_chunk = int(params.get("prefill_chunk_tokens") or 256)
        self.torch_threads = int(params.get("torch_threads") or 1)

        models_dir = os.environ.get("TRITONGATE_MODELS_DIR", "")
        path = os.path.join(models_dir, MODEL_FOLDER)
        if not models_dir or not os.path.isfile(os.path.join(path, "config.json")):
            raise pb_utils.TritonModelException(
                f"{self.name}: no converted model at {path!r} (TRITONGATE_MODELS_DIR="
                f"{models_dir!r}); create it with tritongate.demo_models.smollm2.fetch_smollm2"
            )

        import torch
        from transformers import AutoModelForCausalLM, DynamicCache

        torch.set_num_threads(self.torch_threads)
        dtype = getattr(torch, params.get("dtype") or "bfloat16")
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

        self.pending = queue.Queue()
        self.prefilling = []  # admitted, prompt not fully processed yet
        self.batch = Batch(torch, DynamicCache, self.model.config)
        self.stopping = threading.Event()
        self.worker = threading.Thread(target=self._work, name=f"{self.name}-worker", daemon=True)
        self.worker.start()
        pb_utils.Logger.log_info(
            f"{self.name}: loaded {path} ({dtype}, end id {self.default_end_id}) in {time.monotonic() - started:.1f} s"
        )

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                gen = GenParams(request, self.default_end_id, self.max_positions)
            except RequestError as exc:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=FINAL)
                continue
            self.pending.put(Sequence(request, sender, gen))
        return None

    def finalize(self):
        self.stopping.set()
        self.pending.put(None)  # wake the worker
        self.worker.join(timeout=30)

    # --- the worker thread ---------------------------------------------------------------------

    def _work(self):
        # OpenMP's thread count is per native thread: set it on the thread that computes.
        self.torch.set_num_threads(self.torch_threads)
        with self.torch.inference_mode():
            while not self.stopping.is_set():
                try:
                    self._admit()
                    self._drop_cancelled()
                    if self.prefilling:
                        self._prefill_chunk()
                    if self.batch.seqs:
                        self._decode_step()
                except Exception as exc:  # never let the worker die: fail what is running
                    self._fail(self.batch.seqs + self.prefilling, exc)
                    self.batch.keep([])
                    self.prefilling = []
        for seq in self.batch.seqs + self.prefilling + self._drain():  # unloading: close every stream
            self._send(seq, None, FINAL)

    def _admit(self):
        """Take queued requests while there is room; wait for one when nothing runs."""
        while len(self.batch.seqs) + len(self.prefilling) < self.max_active:
            idle = not self.batch.seqs and not self.prefilling
            try:
                seq = self.pending.get(block=idle, timeout=1.0)
            except queue.Empty:
                return
            if seq is None or self.stopping.is_set():
                return
            if self._cancelled(seq):
                continue
            if seq.gen.max_new <= 0:
                self._send(seq, self._response(seq), FINAL)
                continue
            seq.generator = self.torch.Generator().manual_seed(seq.gen.seed)
            seq.cache = self.DynamicCache(config=self.model.config)
            self.prefilling.append(seq)

    def _prefill_chunk(self):
        """Run the next `prefill_chunk` prompt tokens of the oldest new request, so a long prompt
        does not stall the running streams; after its last chunk, emit its first token and let it
        join the batch."""
        seq = self.prefilling[0]
        try:
            done = seq.cache.get_seq_length()
            chunk = seq.gen.prompt[done : done + self.prefill_chunk]
            out = self.model(
                input_ids=self.torch.tensor([chunk]), past_key_values=seq.cache, use_cache=True, logits_to_keep=1
            )
            if done + len(chunk) < len(seq.gen.prompt):
                return
            self.prefilling.pop(0)
            cache, seq.cache = seq.cache, None
            if not self._advance(seq, out.logits[0, -1].float()):
                self.batch.add(seq, cache)
        except Exception as exc:
            if seq in self.prefilling:
                self.prefilling.remove(seq)
            self._fail([seq], exc)

    def _decode_step(self):
        logits = self.batch.step(self.model)
        running = []
        for row, seq in enumerate(self.batch.seqs):
            try:
                if not self._advance(seq, logits[row]):
                    running.append(row)
            except Exception as exc:
                self._fail([seq], exc)
        self.batch.keep(running)

    def _advance(self, seq, logits):
        """Choose and send `seq`'s next token; True if it was the last."""
        gen = seq.gen
        token, log_prob = self._choose(logits, seq, gen)
        seq.tokens.append(token)
        if gen.log_probs:
            seq.log_probs.append(log_prob)
        done = (
            seq.generated >= gen.max_new
            or token == gen.end_id
            or _ends_with_any(seq.tokens[len(gen.prompt) :], gen.stop_words)
        )
        seq.sender.send(self._response(seq), flags=FINAL if done else 0)
        return done

    def _drop_cancelled(self):
        self.prefilling = [seq for seq in self.prefilling if not self._cancelled(seq)]
        running = [i for i, seq in enumerate(self.batch.seqs) if not self._cancelled(seq)]
        self.batch.keep(running)

    def _cancelled(self, seq):
        if not seq.request.is_cancelled():
            return False
        pb_utils.Logger.log_info(
            f"{self.name}: request {seq.request.request_id()!r} cancelled after {seq.generated} tokens"
        )
        self._send(seq, None, FINAL)
        return True

    def _fail(self, seqs, exc):
        pb_utils.Logger.log_error(f"{self.name}: generation failed: {exc!r}")
        for seq in list(seqs):
            self._send(seq, pb_utils.InferenceResponse(error=pb_utils.TritonError(repr(exc))), FINAL)

    @staticmethod
    def _send(seq, response, flags):
        """Send, ignoring a stream that is already gone (nothing is left to tell)."""
        with contextlib.suppress(Exception):
            if response is None:
                seq.sender.send(flags=flags)
            else:
                seq.sender.send(response, flags=flags)

    def _drain(self):
        seqs = []
        while True:
            try:
                seq = self.pending.get_nowait()
            except queue.Empty:
                return seqs
            if seq is not None:
                seqs.append(seq)

    def _choose(self, logits, seq, gen):
        torch, tokens = self.torch, seq.tokens
        if gen.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(tokens)))
            scores = logits[seen]
            logits[seen] = torch.where(scores < 0, scores * gen.repetition_penalty, scores / gen.repetition_penalty)
        if gen.presence_penalty != 0.0 and seq.generated:
            logits[torch.tensor(sorted(set(tokens[len(gen.prompt) :])))] -= gen.presence_penalty
        for word in gen.bad_words:
            prefix = word[:-1]
            banned = word[-1]
            if 0 <= banned < logits.shape[0] and tokens[len(tokens) - len(prefix) :] == prefix:
                logits[banned] = float("-inf")
        if gen.greedy:
            token = int(torch.argmax(logits))
        else:
            logits = logits / gen.temperature
            token = _sample(torch, logits, gen.top_k, gen.top_p, seq.generator)
        log_prob = 0.0
        if gen.log_probs:  # of the chosen token, after penalties and temperature, before top-k/top-p
            log_prob = float(torch.log_softmax(logits, dim=-1)[token])
        return token, log_prob

    def _response(self, seq):
        gen, tokens = seq.gen, seq.tokens
        width = len(tokens) if self.trim_output else len(gen.prompt) + gen.max_new
        output_ids = np.full((1, 1, width), gen.end_id & 0xFFFFFFFF, dtype=np.uint32)
        output_ids[0, 0, : len(tokens)] = tokens
        outputs = [
            pb_utils.Tensor("output_ids", output_ids),
            pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.uint32)),
            pb_utils.Tensor("response_input_lengths", np.array([[len(gen.prompt)]], dtype=np.int32)),
        ]
        if gen.log_probs:  # FT: [batch, beam, request_output_len] and [batch, beam]
            per_token = np.zeros((1, 1, gen.max_new), dtype=np.float32)
            per_token[0, 0, : len(seq.log_probs)] = seq.log_probs
            outputs.append(pb_utils.Tensor("output_log_probs", per_token))
            outputs.append(pb_utils.Tensor("cum_log_probs", np.array([[sum(seq.log_probs)]], dtype=np.float32)))
        return pb_utils.InferenceResponse(output_tensors=outputs)


def _sample(torch, logits, top_k, top_p, generator):
    if 0 < top_k < logits.shape[0]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if 0.0 < top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        sorted_probs[(torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= top_p] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def _ends_with_any(tokens, words):
    return any(len(word) <= len(tokens) and tokens[len(tokens) - len(word) :] == word for word in words)
