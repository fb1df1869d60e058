"""One rerank (cross-encoder) model: pair-tokenize, score on Triton, post-process, sort."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from services.common.encoder import EncoderModel, Row
from services.common.errors import invalid_argument
from services.common.metrics import Stages
from services.common.triton import Triton
from tritongate.common.v1 import common_pb2
from tritongate.config import RerankModel
from tritongate.registry import RERANK
from tritongate.rerank.v1 import rerank_pb2


def scores(logits: np.ndarray, process: str) -> np.ndarray:
    """The configured post-processing of the model output: one score per document."""
    logits = logits.reshape(len(logits), -1).astype(np.float64)
    if process == "softmax":  # two-logit models: probability of the "relevant" class
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        return (shifted / shifted.sum(axis=1, keepdims=True))[:, -1]
    if process == "normalize":
        return 1.0 / (1.0 + np.exp(-logits[:, 0]))
    return logits[:, 0]


@dataclass
class Encoded:
    """One request's pairs, tokenized: the query's own length, then per document its ids and types."""

    query_tokens: int
    ids: list[list[int]]
    types: list[list[int]] | None


class Reranker(EncoderModel):
    kind = RERANK.kind
    entry: RerankModel

    def __init__(self, entry: RerankModel, triton: Triton) -> None:
        super().__init__(entry, triton)
        self.pair_specials = self.tokenizer.num_special_tokens_to_add(pair=True)

    def configured_output(self) -> str | None:
        return self.entry.output_config.name

    def card(self) -> common_pb2.ModelCard:
        card = super().card()
        card.max_model_len = self.max_tokens
        return card

    def truncate(self, request: rerank_pb2.RerankRequest) -> bool:
        return request.truncate if request.HasField("truncate") else self.entry.truncate

    def encode_many(self, requests: Sequence[rerank_pb2.RerankRequest]) -> list[Encoded | None]:
        """Each request's pairs, in one tokenizer call for the queries and one per truncation setting for
        all pairs (the fast tokenizer encodes a batch in parallel, the per-call overhead is paid once); None
        for a request whose query leaves no room (`tokenize` says why)."""
        queries = self.tokenizer([r.query for r in requests], add_special_tokens=False)["input_ids"]
        lengths = [len(ids) for ids in queries]
        encoded: list[Encoded | None] = [None] * len(requests)
        for truncate in (True, False):
            chosen = [i for i, r in enumerate(requests)
                      if self.truncate(r) == truncate and lengths[i] + self.pair_specials < self.max_tokens]
            queries = [requests[i].query for i in chosen for _ in requests[i].documents]
            documents = [document for i in chosen for document in requests[i].documents]
            if not documents:
                continue
            pairs = self.tokenizer(queries, documents, truncation="only_second" if truncate else False,
                                   max_length=self.max_tokens)
            ids, types = pairs["input_ids"], pairs.get("token_type_ids")
            start = 0
            for i in chosen:
                end = start + len(requests[i].documents)
                encoded[i] = Encoded(lengths[i], ids[start:end], types[start:end] if types is not None else None)
                start = end
        return encoded

    def tokenize(self, request: rerank_pb2.RerankRequest, encoded: Encoded | None = None) -> list[Row]:
        """`[CLS] query [SEP] document [SEP]` rows; documents are cut to fit, the query never is."""
        encoded = encoded or self.encode_many([request])[0]
        if encoded is None:
            query_tokens = len(self.tokenizer(request.query, add_special_tokens=False)["input_ids"])
            raise invalid_argument(f"the query has {query_tokens} tokens, which leaves no room for a document "
                                   f"within `{self.name}`'s limit of {self.max_tokens} tokens", "query")
        rows = []
        for i, ids in enumerate(encoded.ids):
            if len(ids) > self.max_tokens:
                raise invalid_argument(f"documents[{i}] does not fit beside the query in {self.max_tokens} "
                                       "tokens (truncation is off)", "documents")
            rows.append(Row(ids, encoded.types[i] if encoded.types is not None else None))
        return rows

    async def serve(self, request: rerank_pb2.RerankRequest, timeout: float | None,
                    encoded: Encoded | None = None, stages: Stages | None = None) -> rerank_pb2.RerankResponse:
        if not request.documents:  # nothing to score (the edge refuses this for its clients)
            return rerank_pb2.RerankResponse(model=self.name, usage=common_pb2.Usage())
        stages = stages or Stages()
        with stages.tokenizing():
            rows = self.tokenize(request, encoded)
        logits = await self.run(rows, timeout, stages)
        values = logits.reshape(len(rows), -1)[:, 0] if request.raw_scores else scores(
            logits, self.entry.output_config.process)
        order = sorted(range(len(values)), key=lambda i: (-values[i], i))
        if request.top_n:
            order = order[: request.top_n]
        tokens = sum(len(row.input_ids) for row in rows)
        return rerank_pb2.RerankResponse(
            model=self.name,
            results=[rerank_pb2.RerankResult(index=i, score=float(values[i])) for i in order],
            usage=common_pb2.Usage(prompt_tokens=tokens, total_tokens=tokens),
            timings=stages.proto(),
        )
