"""The demo LLM's weights in transformers, as its Triton models run them (the same dtype on the CPU): the
reference the served log probabilities are checked against."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.stack import DEMO_LLM
from tritongate.settings import DEPLOY_DIR

# The FasterTransformer demo model's configuration; every demo LLM runs the same engine options by default.
DEMO_CONFIG = DEPLOY_DIR / "triton" / DEMO_LLM / "config.pbtxt"
# How far a served log probability may be from the reference's: float32 differs only in the order of the
# sums (threads, chunking); bfloat16 keeps 8 bits of mantissa, so a logit of 20 is off by up to 0.06.
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.02}


def served_dtype(config: Path = DEMO_CONFIG) -> str:
    """The dtype a demo LLM runs in on this machine's CPU (its config.pbtxt parameters, as its engine reads them)."""
    from tritongate.demo_models.llm_core import EngineOptions

    parameters = dict(re.findall(r'key: "([^"]+)"[^}]*?string_value: "([^"]*)"', config.read_text(), flags=re.S))
    options = EngineOptions.from_parameters({**parameters, "device": "cpu"})
    return str(options.dtype).removeprefix("torch.")


@dataclass
class ReferenceLM:
    """The demo LLM in transformers: log probabilities of token sequences."""

    model: Any
    torch: Any
    dtype: str

    @classmethod
    def load(cls, models_dir: Path) -> ReferenceLM:
        import torch
        from transformers import AutoModelForCausalLM

        dtype = served_dtype()
        model = AutoModelForCausalLM.from_pretrained(models_dir / DEMO_LLM, dtype=getattr(torch, dtype)).eval()
        return cls(model, torch, dtype)

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype]

    def token_logprobs(self, tokens: list[int]) -> list[float]:
        """Each token's log probability given the ones before it (from the second token on)."""
        torch = self.torch
        with torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([tokens])).logits[0, :-1].float()
        log_probs = torch.log_softmax(logits.double(), dim=-1)
        return [float(log_probs[i, token]) for i, token in enumerate(tokens[1:])]

    def loglikelihood(self, context: list[int], continuation: list[int]) -> float:
        """The continuation's summed log probability after the context."""
        return sum(self.token_logprobs(context + continuation)[len(context) - 1:])

    def next_token(self, tokens: list[int]) -> int:
        """The most likely token after `tokens`."""
        with self.torch.inference_mode():
            return int(self.model(input_ids=self.torch.tensor([tokens])).logits[0, -1].argmax())
