"""The running batch of a demo LLM's engine (tritongate/demo_models/llm_core.py): its sequences' KV cache,
left-padded to a common length, and the attention that lets each row attend only to its own keys and
values, so that a sequence's numbers do not depend on what it is batched with.

Runs inside Triton's Python backend (see llm_core): torch and transformers are imported when first needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tritongate.demo_models.llm_core import Sequence

ROW_ATTENTION = "tritongate_rows"


def row_attention() -> str:
    """Registers the attention the engine's model runs with, and returns its name: transformers'
    SDPA attention, except in a decoding step of the batch (`row_starts` given), where each row attends
    to its own keys and values from its first real position on, without a mask: the same call, on the
    same numbers, as a sequence decoded alone."""
    import torch
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    def attention(module: Any, query: Any, key: Any, value: Any, mask: Any, row_starts: list[int] | None = None,
                  **kwargs: Any) -> tuple[Any, None]:
        if row_starts is None:  # a prompt's prefill, always one sequence
            return sdpa_attention_forward(module, query, key, value, mask, **kwargs)
        rows = [sdpa_attention_forward(module, query[i:i + 1], key[i:i + 1, :, start:].contiguous(),
                                       value[i:i + 1, :, start:].contiguous(), None, **kwargs)[0]
                for i, start in enumerate(row_starts)]
        return torch.cat(rows), None

    AttentionInterface.register(ROW_ATTENTION, attention)
    AttentionMaskInterface.register(ROW_ATTENTION, sdpa_mask)  # prefill: SDPA's causal mask
    return ROW_ATTENTION


class Batch:
    """The active sequences and their KV cache, left-padded to a common length.

    Row i holds `pads[i]` padding positions followed by its real keys and values; every decoding step
    appends one position to every row, and each row's attention starts after its padding (`row_attention`).
    """

    def __init__(self, torch: Any, cache_class: Any, config: Any, device: Any = "cpu") -> None:
        self.torch, self.cache_class, self.config, self.device = torch, cache_class, config, device
        self.seqs: list[Sequence] = []
        self.pads: list[int] = []
        self.cache: Any = None

    def add(self, seq: Sequence, cache: Any) -> None:
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

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (indices), dropping padding no remaining row needs."""
        if len(rows) == len(self.seqs):
            return
        self.seqs = [self.seqs[i] for i in rows]
        self.pads = [self.pads[i] for i in rows]
        if not rows:
            self.cache = None
            return
        index, trim = self.torch.tensor(rows, device=self.device), min(self.pads)
        layers = [(layer.keys[index, :, trim:], layer.values[index, :, trim:]) for layer in self.cache.layers]
        self.cache = self.cache_class(ddp_cache_data=layers, config=self.config)
        self.pads = [p - trim for p in self.pads]

    def step(self, model: Any) -> Any:
        """One decoding step for every row; returns the last-position logits [rows, vocab] on the CPU."""
        torch, length = self.torch, self.cache.get_seq_length()
        input_ids = torch.tensor([[seq.tokens[-1]] for seq in self.seqs], device=self.device)
        positions = torch.tensor([[length - pad] for pad in self.pads], device=self.device)
        out = model(input_ids=input_ids, position_ids=positions, past_key_values=self.cache, use_cache=True,
                    row_starts=self.pads)
        return out.logits[:, -1].float().cpu()

    def _pad(self, tensor: Any, n: int) -> Any:
        if n == 0:
            return tensor
        shape = list(tensor.shape)
        shape[-2] = n
        return self.torch.cat([tensor.new_zeros(shape), tensor], dim=-2)
