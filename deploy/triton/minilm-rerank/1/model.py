import os
import site
import sys

_site = os.environ.get("TRITONGATE_SITE_PACKAGES")
if _site:  # the Python-backend stub runs the base interpreter: the venv's packages first, and its .pth
    sys.path.insert(0, _site)  # files (an editable install of tritongate) through site.addsitedir
    site.addsitedir(_site)

# Demo reranker on the cross-encoder tensor interface, built on the MiniLM-L6 bi-encoder.
#
# Each row is a BERT pair encoding `[CLS] query [SEP] document [SEP]` (token_type_ids 0 for the query
# part, 1 for the document part). The score is `scale * cosine(query_vec, doc_vec) + bias`, where the
# two vectors are mean-pooled MiniLM states of the two segments. `encoding` (config.pbtxt) picks how:
#
# - "pair": one forward pass over the whole pair, pooling each segment's tokens (the segments attend to
#   each other). The default: it is the mode that ranks the Denglin manual's Jiangsu "Article 3" example first.
# - "separate": each segment encoded on its own as `[CLS] text [SEP]` (the document re-gets a [CLS]),
#   unique queries once, i.e. exactly all-MiniLM's own embeddings. Better on generic queries.
#
# With ragged batching every request brings its own [n_i, len_i] tensors: they are padded into one
# batch, scored in one forward pass (two in "separate" mode: documents and unique queries), and the
# logits are split back per request.

import json

import numpy as np
import torch
import torch.nn.functional as F
import triton_python_backend_utils as pb_utils
from transformers import AutoModel, AutoTokenizer

from tritongate.demo_models.device import placement

ENCODER_DIR = "all-minilm-l6-v2"  # under $TRITONGATE_MODELS_DIR


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(1)  # two 1-thread instances beat one 2-thread instance on 2 cores
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        path = os.path.join(os.environ["TRITONGATE_MODELS_DIR"], ENCODER_DIR)
        try:  # the CPU in float32, or a GPU in float16 (the `device` and `dtype` parameters)
            device, dtype = placement(params, cpu_dtype="float32", cuda_dtype="float16", args=args)
        except ValueError as exc:
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc
        self.scorer = Scorer(
            path, params.get("encoding", "pair"), float(params.get("scale", 20.0)), float(params.get("bias", -16.0)),
            device, dtype,
        )

    def execute(self, requests):
        batch, responses = [], [None] * len(requests)
        for i, request in enumerate(requests):
            ids, mask, types = (_input(request, name) for name in ("input_ids", "attention_mask", "token_type_ids"))
            error = self.scorer.check(ids, mask, types)
            if error:
                responses[i] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(error, pb_utils.TritonError.INVALID_ARG)
                )
            else:
                batch.append((i, ids, mask, types))
        if batch:
            logits = self.scorer.score([b[1:] for b in batch])
            for (i, *_), part in zip(batch, logits, strict=True):
                out = pb_utils.Tensor("logits", part.reshape(-1, 1))
                responses[i] = pb_utils.InferenceResponse(output_tensors=[out])
        return responses


def _input(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class Scorer:
    """The model without Triton: takes per-request int64 arrays, returns per-request fp32 logits."""

    def __init__(self, path, encoding, scale, bias, device="cpu", dtype=torch.float32):
        if encoding not in ("pair", "separate"):
            raise ValueError(f"parameter 'encoding' must be 'pair' or 'separate', got {encoding!r}")
        tokenizer = AutoTokenizer.from_pretrained(path)
        self.device = torch.device(device)
        self.encoder = AutoModel.from_pretrained(path, dtype=dtype).eval().to(self.device)
        self.max_len = self.encoder.config.max_position_embeddings
        self.cls_id, self.sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        self.encoding, self.scale, self.bias = encoding, scale, bias

    def check(self, ids, mask, types):
        """An error message for a malformed request, or None."""
        if ids is None or mask is None:
            return "input_ids and attention_mask are required"
        if ids.ndim != 2 or mask.shape != ids.shape or (types is not None and types.shape != ids.shape):
            return "input_ids, attention_mask and token_type_ids must share one [batch, len] shape"
        if ids.shape[1] > self.max_len:
            return f"sequence length {ids.shape[1]} exceeds the model's maximum of {self.max_len}"
        return None

    @torch.inference_mode()
    def score(self, requests):
        """requests: list of (input_ids, attention_mask, token_type_ids or None), each [n_i, len_i]."""
        width = max(r[0].shape[1] for r in requests)
        ids, mask, types = (
            torch.from_numpy(
                np.concatenate([_pad(r[k] if r[k] is not None else self._types(r[0]), width) for r in requests])
            ).to(self.device)
            for k in range(3)
        )
        in_doc = mask.bool() & (types == 1)
        in_query = mask.bool() & (types == 0)
        if self.encoding == "pair":
            hidden = self.encoder(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
            query_vecs, doc_vecs = _mean(hidden, in_query), _mean(hidden, in_doc)
        else:
            query_vecs, doc_vecs = self._encode_queries(ids, in_query), self._encode_docs(ids, in_doc)
        logits = self.scale * F.cosine_similarity(query_vecs, doc_vecs) + self.bias
        sizes = [r[0].shape[0] for r in requests]
        return [part.cpu().numpy().astype(np.float32) for part in torch.split(logits, sizes)]

    def _types(self, ids):
        """token_type_ids as the tokenizer makes them: 1 after the first [SEP]."""
        is_sep = ids == self.sep_id
        return ((np.cumsum(is_sep, axis=1) - is_sep) > 0).astype(np.int64)

    def _encode_queries(self, ids, in_query):
        # The query segment is a prefix `[CLS] q [SEP]`: encode each distinct one once.
        width = int(in_query.sum(1).max())
        queries, which = torch.unique(ids[:, :width] * in_query[:, :width], dim=0, return_inverse=True)
        return self._embed(queries, (queries != 0).long())[which]

    def _encode_docs(self, ids, in_doc):
        # The document segment `d [SEP]` gets a [CLS] in front, as if it had been tokenized alone.
        rows = [torch.cat([ids.new_tensor([self.cls_id]), row[keep]]) for row, keep in zip(ids, in_doc, strict=True)]
        docs = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
        lengths = torch.tensor([len(r) for r in rows], device=self.device)
        return self._embed(docs, (torch.arange(docs.shape[1], device=self.device) < lengths[:, None]).long())

    def _embed(self, ids, mask):
        hidden = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        return _mean(hidden, mask.bool())


def _pad(array, width):
    return np.pad(array.astype(np.int64), ((0, 0), (0, width - array.shape[1])))


def _mean(hidden, keep):
    hidden = hidden.float()  # pooling and the cosine in float32 whatever the encoder's dtype
    keep = keep.unsqueeze(-1).to(hidden.dtype)
    return (hidden * keep).sum(1) / keep.sum(1).clamp(min=1)
