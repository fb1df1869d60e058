"""One embedding model: tokenize, run on Triton, pool, normalise."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from services.common.encoder import EncoderModel, Row
from services.common.errors import ServiceError, invalid_argument
from services.common.metrics import Stages
from services.common.tokenizer import text_encoder
from services.common.triton import Triton
from tritongate.common.v1 import common_pb2
from tritongate.config import EmbeddingModel, Pooling
from tritongate.embed.v1 import embed_pb2
from tritongate.registry import EMBED

# NIM's `truncate` → the side the tokenizer cuts (None: refuse what is too long); TRUNCATION_DEFAULT is
# absent: the model's configuration decides.
_SIDES: dict[int, str | None] = {embed_pb2.TRUNCATION_NONE: None, embed_pb2.TRUNCATION_END: "right",
                                 embed_pb2.TRUNCATION_START: "left"}
_INPUT_PROMPTS = {embed_pb2.INPUT_TYPE_QUERY: "query", embed_pb2.INPUT_TYPE_PASSAGE: "passage"}


def folder_pooling(path: str) -> str:
    """The pooling a sentence-transformers folder declares (1_Pooling/config.json), else CLS."""
    try:
        config = json.loads((Path(path) / "1_Pooling" / "config.json").read_text())
    except (OSError, ValueError):
        return "cls"
    return "mean" if config.get("pooling_mode_mean_tokens") else "cls"


def pool(hidden: np.ndarray, mask: np.ndarray, pooling: Pooling) -> np.ndarray:
    """[batch, seq, dim] hidden states → [batch, dim]; 2-D outputs are already pooled."""
    if hidden.ndim == 2 or pooling == "none":
        return hidden.astype(np.float32, copy=False)
    if pooling == "cls":
        return hidden[:, 0, :].astype(np.float32)
    weights = mask[:, : hidden.shape[1], None].astype(np.float32)
    return (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)


def normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


class Embedder(EncoderModel):
    kind = EMBED.kind
    entry: EmbeddingModel

    def __init__(self, entry: EmbeddingModel, triton: Triton) -> None:
        super().__init__(entry, triton)
        self.pooling: Pooling = folder_pooling(entry.path) if entry.pooling == "auto" else entry.pooling  # type: ignore[assignment]
        self.post = lambda output, mask: pool(output, mask, self.pooling)
        self.default_side = self.tokenizer.truncation_side if entry.truncate else None
        self._encoders: dict[str | None, Callable[[list[str]], list[list[int]]]] = {}  # by side

    def configured_output(self) -> str | None:
        return self.entry.output_name

    @property
    def dimensions(self) -> int:
        return self.output_dims[-1] if self.output_dims and self.output_dims[-1] > 0 else 0

    def card(self) -> common_pb2.ModelCard:
        card = super().card()
        card.max_model_len = self.max_tokens
        card.dimensions = self.dimensions
        return card

    def side(self, request: embed_pb2.EmbedRequest) -> str | None:
        """Where the request's over-long inputs are cut ("right": the end, "left": the start; None: refused)."""
        return _SIDES.get(request.truncation, self.default_side)

    def prompt(self, request: embed_pb2.EmbedRequest) -> str:
        """The text put before each of the request's texts: the prompt it names, else the one of its
        `input_type` when the model has one, else the model's default."""
        prompts = self.entry.prompts
        if request.prompt_name and request.prompt_name not in prompts:
            raise invalid_argument(f"`{self.name}` has no prompt named {request.prompt_name!r} (it has: "
                                   f"{', '.join(prompts) or 'none'})", "prompt_name")
        by_type = _INPUT_PROMPTS.get(request.input_type)
        name = request.prompt_name or (by_type if by_type in prompts else None) or self.entry.default_prompt_name
        return prompts.get(name or "", "")

    def texts(self, request: embed_pb2.EmbedRequest) -> list[str]:
        prompt = self.prompt(request)
        return [prompt + text for text in request.texts.texts]

    def encode(self, texts: list[str], side: str | None) -> list[list[int]]:
        if not texts:
            return []
        if side not in self._encoders:
            self._encoders[side] = text_encoder(self.tokenizer, side, self.max_tokens)
        return self._encoders[side](texts)

    def encode_many(self, requests: Sequence[embed_pb2.EmbedRequest]) -> list[list[list[int]] | None]:
        """The token ids of each text request, in one tokenizer call over all texts cut alike (the fast
        tokenizer encodes a batch in parallel, and the per-call overhead is paid once); None for the
        others, which `tokenize` reads itself (and refuses, when their prompt is)."""
        groups: dict[str | None, list[tuple[int, list[str]]]] = {}  # side → (position, texts)
        for position, request in enumerate(requests):
            if request.WhichOneof("input") != "texts":
                continue
            try:
                texts = self.texts(request)
            except ServiceError:
                continue
            groups.setdefault(self.side(request), []).append((position, texts))
        encoded: list[list[list[int]] | None] = [None] * len(requests)
        for side, members in groups.items():
            ids = iter(self.encode([text for _, texts in members for text in texts], side))
            for position, texts in members:
                encoded[position] = [next(ids) for _ in texts]
        return encoded

    def tokenize(self, request: embed_pb2.EmbedRequest, encoded: list[list[int]] | None = None) -> list[list[int]]:
        """Token ids per input (`encoded`: the texts' already), cut at max_tokens on the request's side (or
        rejected, when truncation is off); prompts go before texts only."""
        side = self.side(request)
        if encoded is not None:
            rows = encoded
        elif request.WhichOneof("input") == "tokens":
            rows = [list(item.ids) for item in request.tokens.inputs]
            self.check_token_ids(rows, "input")
            if side == "right":
                rows = [ids[: self.max_tokens] for ids in rows]
            elif side == "left":
                rows = [ids[-self.max_tokens:] for ids in rows]
        else:
            rows = self.encode(self.texts(request), side)
        for i, ids in enumerate(rows):
            if not ids:
                raise invalid_argument(f"input[{i}] is empty", "input")
            if len(ids) > self.max_tokens:
                raise invalid_argument(f"input[{i}] has {len(ids)} tokens; `{self.name}` accepts at most "
                                       f"{self.max_tokens}", "input")
        return rows

    def rows(self, request: embed_pb2.EmbedRequest, encoded: list[list[int]] | None = None) -> list[list[int]]:
        """The request's token rows, checked (tokens, `dimensions`) before anything runs."""
        rows = self.tokenize(request, encoded)
        if request.dimensions and self.dimensions and request.dimensions > self.dimensions:
            raise invalid_argument(f"`dimensions` is {request.dimensions}, but `{self.name}` has "
                                   f"{self.dimensions}", "dimensions")
        return rows

    def answer(self, request: embed_pb2.EmbedRequest, rows: list[list[int]], vectors: np.ndarray,
               stages: Stages | None = None) -> embed_pb2.EmbedResponse:
        """The EmbedResponse from the model's vectors for `rows`: cut to `dimensions`, normalised."""
        if request.dimensions:
            vectors = vectors[:, : request.dimensions]
        if request.normalize if request.HasField("normalize") else self.entry.normalize:
            vectors = normalize(vectors)
        tokens = sum(len(ids) for ids in rows)
        return embed_pb2.EmbedResponse(
            model=self.name,
            embeddings=np.ascontiguousarray(vectors, dtype="<f4").tobytes(),
            rows=vectors.shape[0],
            dimensions=vectors.shape[1],
            usage=common_pb2.Usage(prompt_tokens=tokens, total_tokens=tokens),
            timings=stages.proto() if stages is not None else None,
        )

    async def serve(self, request: embed_pb2.EmbedRequest, timeout: float | None,
                    encoded: list[list[int]] | None = None, stages: Stages | None = None) -> embed_pb2.EmbedResponse:
        stages = stages or Stages()
        with stages.tokenizing():
            rows = self.rows(request, encoded)
        await self.ensure_ready()
        return self.answer(request, rows, await self.run([Row(ids) for ids in rows], timeout, stages), stages)

    async def serve_many(self, requests: Sequence[embed_pb2.EmbedRequest], timeout: float | None
                         ) -> list[embed_pb2.EmbedResponse | ServiceError]:
        """The requests of a batch RPC, as one: tokenized in one call, their rows in one submission to
        the batcher, each request's answer (or its own error) cut from the vectors; their stages are
        those of the whole."""
        answers: list[embed_pb2.EmbedResponse | ServiceError] = []
        accepted: list[tuple[int, list[list[int]]]] = []  # (position, rows)
        stages = Stages()
        with stages.tokenizing():
            for position, (request, encoded) in enumerate(zip(requests, self.encode_many(requests), strict=True)):
                try:
                    accepted.append((position, self.rows(request, encoded)))
                    answers.append(_PENDING)
                except ServiceError as exc:
                    answers.append(exc)
        if not accepted:
            return answers
        try:
            await self.ensure_ready()
            vectors = await self.run([Row(ids) for _, rows in accepted for ids in rows], timeout, stages)
        except ServiceError as exc:
            return [exc if answer is _PENDING else answer for answer in answers]
        start = 0
        for position, rows in accepted:
            answers[position] = self.answer(requests[position], rows, vectors[start:start + len(rows)], stages)
            start += len(rows)
        return answers


_PENDING = embed_pb2.EmbedResponse()  # a place held for an answer that is still to come
