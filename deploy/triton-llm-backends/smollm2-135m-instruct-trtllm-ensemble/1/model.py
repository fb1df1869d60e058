import os, site, sys  # noqa: E401, I001  (must come first; see below)

_site = os.environ.get("TRITONGATE_SITE_PACKAGES")
if _site:  # the Python-backend stub runs the base interpreter: the venv's packages first, and its .pth
    sys.path.insert(0, _site)  # files (an editable install of tritongate) through site.addsitedir
    site.addsitedir(_site)

"""SmolLM2-135M-Instruct behind the text interface of TensorRT-LLM's `ensemble` (and `tensorrt_llm_bls`).

The three steps of the real ensemble, in one model:
- preprocessing (its `preprocessing/1/model.py`): `text_input` tokenized (with special tokens, parameter
  `add_special_tokens`); `end_id` and `pad_id` default to the tokenizer's end and pad tokens (so, unlike
  the bare tensorrt_llm model, generation stops at <|im_end|>); `stop_words` / `bad_words` hold one word
  per element, each tokenized without special tokens (empty ones dropped) into the [2, N] word lists;
  `embedding_bias_words` / `_weights` become the embedding bias (each word's tokens get its weight);
- tensorrt_llm (tritongate/demo_models/llm_trtllm.py, as in smollm2-135m-instruct-trtllm), with the
  ensemble's names: `max_tokens`, `top_k`, `top_p`, `length_penalty`, `stream`;
- postprocessing: `output_ids` → `text_output` [1] (special tokens skipped, parameter
  `skip_special_tokens`); the other outputs pass through.

So without `stream` the one response's text is prompt + completion (the prompt's special tokens
skipped), or the completion alone with `exclude_input_in_output`; with `stream` each response's text is
the text of its new tokens. The real postprocessing decodes each response's tokens on their own, so a
character whose UTF-8 bytes span two tokens comes out as two U+FFFD; parameter `streaming_decode`:
"incremental" (the default here) decodes each generation incrementally instead, so a response never ends
inside a character (a token that starts one yields "" until the token that completes it);
"per_response" reproduces the real postprocessing.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from tritongate.demo_models.llm_core import RequestError, load_engine
from tritongate.demo_models.llm_text import IncrementalDecoder, load_tokenizer
from tritongate.demo_models.llm_trtllm import Inputs, TrtllmRequest, parse_items, refusal

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# The ensemble's inputs that reach the tensorrt_llm step under another name.
RENAMED = {"runtime_top_k": "top_k", "runtime_top_p": "top_p", "len_penalty": "length_penalty",
           "streaming": "stream", "request_output_len": "max_tokens"}


def _flag(params, name, default):
    return params.get(name, default).lower() in ("true", "1", "t", "y", "yes")


class Request(TrtllmRequest):
    """One request: the tensorrt_llm step's responses, postprocessed into text."""

    def __init__(self, model, request, items, **options):
        super().__init__(items, cancelled=request.is_cancelled, **options)
        self.model, self.sender = model, request.get_response_sender()
        self.decoders = {}  # per sequence, when decoding incrementally

    def emit(self, seq, outputs, ended, last):
        ids = outputs.pop("output_ids")[0, 0, : int(outputs.pop("sequence_length")[0, 0])].tolist()
        if self.streaming and self.model.incremental:
            decoder = self.decoders.setdefault(seq.index, IncrementalDecoder(self.model.tokenizer, self.model.skip))
            text = decoder.add(ids) + (decoder.flush() if ended else "")
        else:
            text = self.model.tokenizer.decode(ids, skip_special_tokens=self.model.skip)
        tensors = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
        tensors += [pb_utils.Tensor(name, value) for name, value in outputs.items()]
        self.sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=FINAL if last else 0)

    def emit_error(self, message):
        self.sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(f"{args['model_name']} must be decoupled")
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.add_special_tokens = _flag(params, "add_special_tokens", "true")
        self.skip = _flag(params, "skip_special_tokens", "true")
        self.incremental = params.get("streaming_decode", "incremental") != "per_response"
        self.exclude_input = _flag(params, "exclude_input_in_output", "false")
        try:
            self.engine = load_engine(args["model_name"], params, pb_utils.Logger.log_info, args)
            self.tokenizer = load_tokenizer()
        except (RuntimeError, ValueError) as exc:  # no weights, or an unusable device or dtype
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc
        tokenizer = self.tokenizer
        self.end_id = tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)[0]
        pad = tokenizer.pad_token or tokenizer.eos_token
        self.pad_id = tokenizer.encode(pad, add_special_tokens=False)[0]

    def execute(self, requests):
        for request in requests:
            try:
                owner = self._parse(request)
            except RequestError as exc:  # refused before generating, in the words of TensorRT-LLM's checks
                # (INVALID_ARG, which a stream does not carry: the llm service tells a refusal by those words there)
                error = pb_utils.TritonError(refusal(str(exc)), pb_utils.TritonError.INVALID_ARG)
                request.get_response_sender().send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            except Exception as exc:  # a preprocessing failure, reported as the ensemble reports it
                request.get_response_sender().send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{type(exc).__name__}: {exc}")),
                    flags=FINAL)
                continue
            self.engine.submit(owner.seqs)
        return None

    def finalize(self):
        self.engine.close()

    def _parse(self, request):
        def given(name):
            found = pb_utils.get_input_tensor_by_name(request, name)
            return None if found is None else found.as_numpy()

        texts = given("text_input").reshape(-1)
        batch = len(texts)
        prompts = [self.tokenizer.encode(_text(t), add_special_tokens=self.add_special_tokens) for t in texts]
        computed = {
            "end_id": np.full((batch, 1), self.end_id, np.int32) if given("end_id") is None else given("end_id"),
            "pad_id": np.full((batch, 1), self.pad_id, np.int32) if given("pad_id") is None else given("pad_id"),
            "stop_words_list": self._word_lists(given("stop_words"), batch),
            "bad_words_list": self._word_lists(given("bad_words"), batch),
            "embedding_bias": self._bias(given("embedding_bias_words"), given("embedding_bias_weights"), batch),
        }

        def get(name):  # the tensorrt_llm step's input `name`
            return computed[name] if name in computed else given(RENAMED.get(name, name))

        inputs = Inputs(get, batch)
        items = parse_items(inputs, prompts, end_id=None, exclude_input=self.exclude_input,
                            vocab_size=self.engine.vocab_size, max_positions=self.engine.max_positions,
                            compile_guide=self.engine.compile_guide)
        return Request(
            self, request, items, streaming=bool(inputs.scalar("streaming", 0, False, bool)),
            request_id=request.request_id(),
            return_num_input_tokens=bool(inputs.scalar("return_num_input_tokens", 0, False, bool)),
            return_num_output_tokens=bool(inputs.scalar("return_num_output_tokens", 0, False, bool)),
        )

    def _word_lists(self, words, batch):
        """preprocessing's `_to_word_list_format`: [batch, 2, N] ids and cumulative offsets."""
        if words is None:
            return np.empty([batch, 2, 0], dtype=np.int32)
        flat_ids, offsets = [], []
        for row in words.reshape(batch, -1):
            ids = [self.tokenizer.encode(_text(word), add_special_tokens=False) for word in row]
            ids = [word for word in ids if word]
            flat_ids.append([t for word in ids for t in word])
            offsets.append(np.cumsum([len(word) for word in ids]).tolist())
        width = max(1, max(len(ids) for ids in flat_ids))
        return np.array([[ids + [0] * (width - len(ids)), offs + [-1] * (width - len(offs))]
                         for ids, offs in zip(flat_ids, offsets, strict=True)], dtype=np.int32)

    def _bias(self, words, weights, batch):
        """preprocessing's `_get_embedding_bias`."""
        if words is None or weights is None:
            return np.empty([batch, 0], dtype=np.float32)
        biases = []
        for row_words, row_weights in zip(words.reshape(batch, -1), weights.reshape(batch, -1), strict=True):
            if len(row_words) != len(row_weights):
                raise RequestError("Embedding bias words must have same dimension as embedding bias weights")
            bias = np.zeros(len(self.tokenizer.vocab), dtype=np.float32)
            for word, weight in zip(row_words, row_weights, strict=True):
                for token in self.tokenizer.encode(_text(word)):
                    bias[token] += weight
            biases.append(bias)
        return np.array(biases, dtype=np.float32)


def _text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
