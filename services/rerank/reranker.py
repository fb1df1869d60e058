"""One rerank (cross-encoder) model: pair-tokenize, score on Triton, post-process, sort."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from services.common.encoder import EncoderModel, Row
from services.common.errors import invalid_argument
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

    def tokenize(self, query: str, documents: Sequence[str], truncate: bool) -> list[Row]:
        """`[CLS] query [SEP] document [SEP]` rows; documents are cut to fit, the query never is."""
        query_tokens = len(self.tokenizer(query, add_special_tokens=False)["input_ids"])
        if query_tokens + self.pair_specials >= self.max_tokens:
            raise invalid_argument(f"the query has {query_tokens} tokens, which leaves no room for a document "
                                   f"within `{self.name}`'s limit of {self.max_tokens} tokens", "query")
        encoded = self.tokenizer([query] * len(documents), list(documents),
                                 truncation="only_second" if truncate else False, max_length=self.max_tokens)
        types = encoded.get("token_type_ids")
        rows = []
        for i, ids in enumerate(encoded["input_ids"]):
            if len(ids) > self.max_tokens:
                raise invalid_argument(f"documents[{i}] does not fit beside the query in {self.max_tokens} "
                                       "tokens (truncation is off)", "documents")
            rows.append(Row(ids, types[i] if types is not None else None))
        return rows

    async def rerank(self, request: rerank_pb2.RerankRequest, timeout: float | None) -> rerank_pb2.RerankResponse:
        if not request.documents:  # nothing to score (the edge refuses this for its clients)
            return rerank_pb2.RerankResponse(model=self.name, usage=common_pb2.Usage())
        truncate = request.truncate if request.HasField("truncate") else self.entry.truncate
        rows = self.tokenize(request.query, request.documents, truncate)
        logits = await self.run(rows, timeout)
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
        )
