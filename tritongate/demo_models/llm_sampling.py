"""How a demo LLM's engine (tritongate/demo_models/llm_core.py) chooses each token of a sequence: its
`Sampling` (what each model.py maps its backend's inputs onto), applied to the model's logits on the CPU
with the sequence's seeded generator.

Runs inside Triton's Python backend (see llm_core): torch is passed in, never imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tritongate.demo_models.llm_core import Sequence


@dataclass
class Sampling:
    """How one sequence is generated; each model.py maps its backend's inputs onto it."""

    max_new_tokens: int
    greedy: bool = True
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    seed: int | None = 0  # None: a random seed
    repetition_penalty: float = 1.0  # over the prompt and the generated tokens
    presence_penalty: float = 0.0  # over the generated tokens
    frequency_penalty: float = 0.0  # over the generated tokens
    min_tokens: int = 0  # end ids are banned (and stop words not checked) before this many tokens
    end_ids: tuple[int, ...] = ()  # a generated end id ends the sequence ("stop"); () never stops early
    stop_words: list[list[int]] = field(default_factory=list)  # token sequences that end it ("stop")
    bad_words: list[list[int]] = field(default_factory=list)  # token sequences never completed
    bias: Any = None  # added to the logits: a float32 numpy array of the vocabulary's size
    allowed_ids: list[int] | None = None  # only these tokens may be generated
    logprobs: bool = False  # record each token's log-probability and rank (1 = the most likely)
    top_logprobs: int = 0  # and this many most likely alternatives (needs logprobs)
    grammar: Any = None  # a compiled guide (Engine.compile_guide) every token must fit; None: free text
    beam_width: int = 1  # > 1: beam search (llm_beams.py) instead of greedy or sampled choice
    length_penalty: float = 0.0  # beam search: a hypothesis scores its log-probability / length ** this
    context_logits: bool = False  # keep the logits of every prompt position (Sequence.context_logits)
    generation_logits: bool = False  # keep the model's logits of every generated position (before any sampling
    # rule: penalties, bias, bans, grammar, temperature), in Sequence.generation_logits


def choose(torch: Any, logits: Any, seq: Sequence) -> int:
    """`seq`'s next token from the model's last-position `logits` [vocab], under its sampling: penalties,
    bans, its grammar, then greedy or sampled; records its log-probabilities when asked. `logits` are on
    the CPU, so every tensor made here is too."""
    s = seq.sampling
    logits = adjust(torch, logits, seq)
    if s.greedy:
        token = int(torch.argmax(logits))
    else:
        logits = logits / s.temperature
        token = _sample(torch, logits, s, seq.generator)
    if s.logprobs:  # after penalties and temperature, before top-k/top-p/min-p
        log_probs = torch.log_softmax(logits, dim=-1)
        seq.logprobs.append(float(log_probs[token]))
        seq.ranks.append(int((log_probs > log_probs[token]).sum()) + 1)
        if s.top_logprobs:
            values, ids = torch.topk(log_probs, s.top_logprobs)
            seq.top.append([(int(i), float(v)) for i, v in zip(ids, values, strict=True)])
    return token


def adjust(torch: Any, logits: Any, seq: Sequence) -> Any:
    """`logits` after `seq`'s penalties, bias, bans and grammar: what greedy, sampled and beam choices
    start from."""
    s, tokens = seq.sampling, seq.tokens
    if s.generation_logits:
        seq.generation_logits.append(logits.clone())
    if s.bias is not None:
        logits = logits + torch.from_numpy(s.bias)
    if s.allowed_ids is not None:
        allowed = torch.full_like(logits, float("-inf"))
        allowed[torch.tensor(s.allowed_ids)] = 0.0
        logits = logits + allowed
    if s.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(tokens)))
        scores = logits[seen]
        logits[seen] = torch.where(scores < 0, scores * s.repetition_penalty, scores / s.repetition_penalty)
    if seq.counts and (s.presence_penalty or s.frequency_penalty):
        ids = torch.tensor(list(seq.counts))
        counts = torch.tensor([float(n) for n in seq.counts.values()])
        logits[ids] -= s.presence_penalty + s.frequency_penalty * counts
    for word in s.bad_words:
        prefix = word[:-1]
        if word and 0 <= word[-1] < logits.shape[0] and tokens[len(tokens) - len(prefix):] == prefix:
            logits[word[-1]] = float("-inf")
    if seq.generated < s.min_tokens:
        for end in s.end_ids:
            if 0 <= end < logits.shape[0]:
                logits[end] = float("-inf")
    if seq.matcher is not None:  # last: nothing after it may allow a token the grammar forbids
        logits = seq.matcher.mask(logits)
    return logits


def _sample(torch: Any, logits: Any, s: Sampling, generator: Any) -> int:
    if 0 < s.top_k < logits.shape[0]:
        kth = torch.topk(logits, s.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if 0.0 < s.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        sorted_probs[(torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= s.top_p] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    if s.min_p > 0.0:
        probs = probs.masked_fill(probs < s.min_p * probs.max(), 0.0)
    return int(torch.multinomial(probs, 1, generator=generator))
