"""Beam search in the demo LLMs' engine (tritongate/demo_models/llm_core.py), as FasterTransformer's and
TensorRT-LLM's `beam_width` run it.

A request with `Sampling.beam_width` W > 1 is prefilled once; its W beams then take W rows of the batch.
Every step, each beam's next-token log-probabilities (after the request's penalties and bans,
llm_sampling.adjust) are added to the beam's cumulative log-probability, and the best 2W continuations of
all beams are ranked: one ending with an end id or a stop word finishes a hypothesis (when it ranks among
the first W), the others become the next beams, W of them. A beam that continues another's hypothesis
takes over that row's keys and values (`Batch.copy`).

A hypothesis scores its cumulative log-probability divided by (generated tokens) ** `length_penalty`
(0, both backends' default: the plain log-probability). The search ends when W hypotheses have finished
and no running beam scores better than the worst of them, or at `max_new_tokens`, where the running beams
count as finished; the best W, by score, are the answer. Temperature, top-k and top-p do not apply to
beams, as in both backends' beam search; a grammar cannot be followed by several beams at once and is
refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tritongate.demo_models.llm_sampling import adjust

if TYPE_CHECKING:
    from tritongate.demo_models.llm_core import Sequence


@dataclass
class Hypothesis:
    """One beam's generated tokens, their log-probabilities and how it ended ("stop", "length" or None)."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reason: str | None = None

    @property
    def cum_logprob(self) -> float:
        return sum(self.logprobs)

    def score(self, length_penalty: float) -> float:
        return self.cum_logprob / max(len(self.tokens), 1) ** length_penalty


class BeamSearch:
    """The beams of one request (`request`, the sequence its model.py submitted): their rows' sequences
    and the finished hypotheses."""

    def __init__(self, request: Sequence) -> None:
        self.request = request
        self.width = request.sampling.beam_width
        self.beams: list[Sequence] = []  # the running beams, best first; each holds one batch row
        self.finished: list[Hypothesis] = []  # at most `width`, best first
        self.done = False

    def start(self, torch: Any, logits: Any) -> list[Sequence]:
        """The first step, from the prompt's last logits [vocab]: the beams, to put in the batch."""
        self._advance(torch, [self.request], logits[None])
        return self.beams

    def step(self, torch: Any, logits: Any) -> list[int]:
        """A decoding step from each beam's logits [width, vocab], in `beams` order; returns, for each new
        beam, the index of the beam it continues (whose keys and values it takes over)."""
        return self._advance(torch, self.beams, logits)

    def best(self) -> list[Hypothesis]:
        """The hypotheses, best first: the finished ones and, until the search ends, the running beams."""
        running = [self._hypothesis(beam, "length" if self.done else None) for beam in self.beams]
        if not self.done:
            return sorted(running, key=lambda h: -h.cum_logprob)
        penalty = self.request.sampling.length_penalty
        return sorted(self.finished + running, key=lambda h: -h.score(penalty))[:self.width]

    def _advance(self, torch: Any, beams: list[Sequence], logits: Any) -> list[int]:
        s = self.request.sampling
        log_probs = torch.stack([torch.log_softmax(adjust(torch, logits[i], beam), dim=-1)
                                 for i, beam in enumerate(beams)])
        cum = torch.tensor([sum(beam.logprobs) for beam in beams], dtype=log_probs.dtype)
        scores = (cum[:, None] + log_probs).reshape(-1)
        vocab = log_probs.shape[1]
        # enough candidates that W of them continue even if every beam's best is an end
        wanted = min(scores.numel(), self.width * (2 + len(s.end_ids) + len(s.stop_words)))
        top = torch.topk(scores, wanted)
        parents: list[int] = []
        next_beams: list[Sequence] = []
        for rank, (score, index) in enumerate(zip(top.values.tolist(), top.indices.tolist(), strict=True)):
            if score == float("-inf"):
                break
            parent, token = divmod(index, vocab)
            beam = beams[parent].fork(token, float(log_probs[parent, token]))
            if self._ends(beam):
                if rank < self.width:
                    self._finish(self._hypothesis(beam, "stop"))
                continue
            next_beams.append(beam)
            parents.append(parent)
            if len(next_beams) == self.width:
                break
        self.beams = next_beams
        generated = next_beams[0].generated if next_beams else 0
        if not next_beams or generated >= s.max_new_tokens:
            self.done = True
        elif len(self.finished) == self.width:  # no running beam can still beat the worst finished one
            worst = self.finished[-1].score(s.length_penalty)
            self.done = max(h.score(s.length_penalty) for h in map(self._hypothesis, next_beams)) <= worst
        return parents

    def _ends(self, beam: Sequence) -> bool:
        s, tokens = beam.sampling, beam.tokens
        if beam.generated < s.min_tokens:
            return False
        return tokens[-1] in s.end_ids or any(
            0 < len(word) <= beam.generated and tokens[len(tokens) - len(word):] == word for word in s.stop_words)

    def _finish(self, hypothesis: Hypothesis) -> None:
        penalty = self.request.sampling.length_penalty
        self.finished = sorted([*self.finished, hypothesis], key=lambda h: -h.score(penalty))[:self.width]

    @staticmethod
    def _hypothesis(beam: Sequence, reason: str | None = None) -> Hypothesis:
        return Hypothesis(beam.new_tokens(), list(beam.logprobs), reason)


def beam_arrays(hypotheses: list[Hypothesis], count: int, *, prefix: list[int], keep_end: bool,
                end_ids: tuple[int, ...], pad: int, width: int | None = None) -> dict[str, Any]:
    """The first `count` hypotheses as a backend's beam tensors: `output_ids` [1, count, width] (each
    beam's `prefix`, the prompt where the interface returns it, then its tokens, padded with `pad`),
    `sequence_length` [1, count], and `output_log_probs` [1, count, width - len(prefix)] and
    `cum_log_probs` [1, count]. `keep_end`: whether a hypothesis keeps the end id it ended with; `width`:
    the interface's fixed width, else the longest beam's. Missing beams are empty."""
    import numpy as np

    beams = []
    for hypothesis in hypotheses[:count]:
        tokens, values = hypothesis.tokens, hypothesis.logprobs
        if not keep_end and hypothesis.reason == "stop" and tokens and tokens[-1] in end_ids:
            tokens, values = tokens[:-1], values[:-1]
        beams.append((tokens, values))
    beams += [([], [])] * (count - len(beams))
    width = width if width is not None else len(prefix) + max(len(tokens) for tokens, _ in beams)
    ids = np.full((1, count, width), pad, dtype=np.int64)
    per_token = np.zeros((1, count, width - len(prefix)), dtype=np.float32)
    for k, (tokens, values) in enumerate(beams):
        ids[0, k, :len(prefix) + len(tokens)] = prefix + tokens
        per_token[0, k, :len(values)] = values
    return {
        "output_ids": ids,
        "sequence_length": np.array([[len(prefix) + len(tokens) for tokens, _ in beams]], dtype=np.int64),
        "output_log_probs": per_token,
        "cum_log_probs": np.array([[sum(values) for _, values in beams]], dtype=np.float32),
    }
