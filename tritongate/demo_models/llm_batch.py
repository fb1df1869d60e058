"""The running batch of a demo LLM's engine (tritongate/demo_models/llm_core.py): up to `rows` rows, each
holding one sequence or nothing, their KV cache left-padded to a common length, and the attention that
lets each row attend only to its own keys and values.

A sequence's numbers do not depend on what it is batched with:

- each row's attention runs on its own keys and values (`row_attention`), from its first real position
  on, without a mask: the same call, on the same numbers, whatever the other rows hold or how they are
  padded. Free rows skip attention.
- the matrix products: a float32 kernel may round a row differently with a different number of rows
  (MKL's do). Where a row's result is the same whatever the number of rows (the packed oneDNN products of
  llm_linear.py; `independent_of_width` checks it on the real model when the engine loads) a step runs
  only the used rows, kept at the front (`fixed` False). Otherwise every step runs all `rows` rows, used
  or not (`fixed` True): every product then has the same shape whatever the load, at the price of one
  sequence alone costing a step of `rows` rows.

The batch's keys and values live in buffers with room to grow (`buffered_cache`): a step writes its
position in place, where transformers' DynamicCache would copy the whole cache of every layer.

Runs inside Triton's Python backend (see llm_core): torch and transformers are imported when first needed.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tritongate.demo_models.llm_core import Sequence

ROW_ATTENTION = "tritongate_rows"


def row_attention() -> str:
    """Registers the attention the engine's model runs with, and returns its name: transformers'
    SDPA attention, except in a decoding step of the batch (`row_starts` given), where each used row
    attends to its own keys and values from its first real position on, without a mask, and a free row
    (start None) to nothing."""
    import torch
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    def attention(module: Any, query: Any, key: Any, value: Any, mask: Any,
                  row_starts: list[int | None] | None = None, **kwargs: Any) -> tuple[Any, None]:
        if row_starts is None:  # a prompt's prefill, always one sequence
            return sdpa_attention_forward(module, query, key, value, mask, **kwargs)
        rows: list[Any] = [None] * len(row_starts)
        for i, start in enumerate(row_starts):
            if start is not None:
                rows[i] = sdpa_attention_forward(module, query[i:i + 1], key[i:i + 1, :, start:].contiguous(),
                                                 value[i:i + 1, :, start:].contiguous(), None, **kwargs)[0]
        used = next(row for row in rows if row is not None)
        return torch.cat([used.new_zeros(used.shape) if row is None else row for row in rows]), None

    AttentionInterface.register(ROW_ATTENTION, attention)
    AttentionMaskInterface.register(ROW_ATTENTION, sdpa_mask)  # prefill: SDPA's causal mask
    return ROW_ATTENTION


SPARE_POSITIONS = 64  # a buffer's room to grow before it is copied into a larger one


def buffered_cache(cache_class: Any, config: Any, layers: list[tuple[Any, Any]]) -> Any:
    """A cache of `cache_class` (transformers' DynamicCache) holding `layers` (keys, values) in buffers
    with spare positions: each layer's `keys` and `values` are views of the buffers' filled part."""
    cache = cache_class(config=config)
    cache.layers = [_buffered_layer()() for _ in layers]
    for layer, (keys, values) in zip(cache.layers, layers, strict=True):
        layer.update(keys, values)
    return cache


@functools.cache
def _buffered_layer() -> Any:
    from transformers.cache_utils import DynamicLayer

    class BufferedLayer(DynamicLayer):
        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                self.buffers: tuple[Any, Any] | None = None
            # a step may run only the first `rows` rows (Batch.fixed False): the others are free
            length, new, rows = self.get_seq_length(), key_states.shape[-2], key_states.shape[0]
            if self.buffers is None or length + new > self.buffers[0].shape[-2]:
                self.buffers = (self._grow(self.keys, key_states, length + new),
                                self._grow(self.values, value_states, length + new))
            self.buffers[0][:rows, :, length:length + new] = key_states
            self.buffers[1][:rows, :, length:length + new] = value_states
            self.keys, self.values = self.buffers[0][:, :, :length + new], self.buffers[1][:, :, :length + new]
            return self.keys[:rows], self.values[:rows]

        @staticmethod
        def _grow(old: Any, new: Any, length: int) -> Any:
            shape = list(new.shape)
            shape[0] = old.shape[0] if old.numel() else shape[0]
            shape[-2] = length + SPARE_POSITIONS
            buffer = new.new_empty(shape)
            if old.numel():
                buffer[:, :, :old.shape[-2]] = old
            return buffer

    return BufferedLayer


class Batch:
    """`rows` rows, each a sequence or free (None), and their KV cache [rows, heads, length, dim].

    Row i's real keys and values start at `starts[i]` (left padding before); every decoding step appends
    one position to every row. A free row's contents are never read. `fixed` False: the used rows are kept
    at the front and a step runs only them.
    """

    def __init__(self, torch: Any, cache_class: Any, config: Any, device: Any = "cpu", rows: int = 1,
                 fixed: bool = True) -> None:
        self.torch, self.cache_class, self.config, self.device = torch, cache_class, config, device
        self.fixed = fixed
        self.seqs: list[Sequence | None] = [None] * rows
        self.starts: list[int | None] = [None] * rows
        self.cache: Any = None

    @property
    def rows(self) -> int:
        return len(self.seqs)

    def used(self) -> list[tuple[int, Sequence]]:
        """(row, sequence) of every used row, in row order."""
        return [(row, seq) for row, seq in enumerate(self.seqs) if seq is not None]

    def free(self) -> int:
        return self.seqs.count(None)

    def add(self, seq: Sequence, cache: Any) -> int:
        """Put `seq`, with its own prefilled batch-1 cache, in a free row; returns the row."""
        row = self.seqs.index(None)
        new = cache.get_seq_length()
        if self.cache is None:
            layers = [(self._rows_of(mine.keys), self._rows_of(mine.values)) for mine in cache.layers]
            self.cache, self.starts = buffered_cache(self.cache_class, self.config, layers), [None] * self.rows
        old = self.cache.get_seq_length()
        if new > old:  # longer than the batch: pad every row on the left
            layers = [(self._pad(layer.keys, new - old), self._pad(layer.values, new - old))
                      for layer in self.cache.layers]
            self.cache = buffered_cache(self.cache_class, self.config, layers)
            self.starts = [None if start is None else start + new - old for start in self.starts]
        width = max(old, new)
        for layer, theirs in zip(self.cache.layers, cache.layers, strict=True):
            layer.keys[row, :, width - new:] = theirs.keys[0]
            layer.values[row, :, width - new:] = theirs.values[0]
        self.seqs[row], self.starts[row] = seq, width - new
        return row

    def copy(self, rows: list[int], sources: list[int]) -> None:
        """Row rows[i] takes over row sources[i]'s keys and values (a beam continuing another's hypothesis);
        the rows must start at the same position."""
        if rows == sources:
            return
        to, source = self.torch.tensor(rows, device=self.device), self.torch.tensor(sources, device=self.device)
        for layer in self.cache.layers:
            layer.keys[to] = layer.keys[source]  # the right side is gathered first: a permutation is safe
            layer.values[to] = layer.values[source]

    def drop(self, rows: list[int]) -> None:
        """Free `rows`, and drop the padding no used row needs."""
        if not rows:
            return
        for row in rows:
            self.seqs[row], self.starts[row] = None, None
        if not self.fixed and self.cache is not None:  # the last used rows fill the holes
            used = [row for row, _ in self.used()]
            holes = [row for row in range(len(used)) if self.seqs[row] is None]
            movers = [row for row in used if row >= len(used)]
            self.copy(holes, movers)
            for hole, mover in zip(holes, movers, strict=True):
                self.seqs[hole], self.starts[hole] = self.seqs[mover], self.starts[mover]
                self.seqs[mover], self.starts[mover] = None, None
        starts = [start for start in self.starts if start is not None]
        if not starts:
            self.cache = None
            return
        trim = min(starts)
        if trim:
            layers = [(layer.keys[:, :, trim:], layer.values[:, :, trim:]) for layer in self.cache.layers]
            self.cache = buffered_cache(self.cache_class, self.config, layers)
            self.starts = [None if start is None else start - trim for start in self.starts]

    def step(self, model: Any) -> Any:
        """One decoding step; returns the last-position logits [rows run, vocab] on the CPU, by row (a free
        row's are meaningless)."""
        torch, length = self.torch, self.cache.get_seq_length()
        width = self.rows if self.fixed else max(row for row, _ in self.used()) + 1
        seqs, starts = self.seqs[:width], self.starts[:width]
        input_ids = torch.tensor([[0 if seq is None else seq.tokens[-1]] for seq in seqs], device=self.device)
        positions = torch.tensor([[0 if start is None else length - start] for start in starts], device=self.device)
        out = model(input_ids=input_ids, position_ids=positions, past_key_values=self.cache, use_cache=True,
                    row_starts=starts)
        return out.logits[:, -1].float().cpu()

    def _rows_of(self, tensor: Any) -> Any:
        """A batch-1 tensor as `rows` rows (the others zeros), for the first sequence's cache."""
        shape = list(tensor.shape)
        shape[0] = self.rows
        return tensor.new_zeros(shape)

    def _pad(self, tensor: Any, n: int) -> Any:
        shape = list(tensor.shape)
        shape[-2] = n
        return self.torch.cat([tensor.new_zeros(shape), tensor], dim=-2)


def independent_of_width(torch: Any, model: Any, cache_class: Any, config: Any, device: Any, rows: int) -> bool:
    """Whether, on this model and machine, a decoding step gives a row bitwise the same logits alone as next
    to 1 to `rows` - 1 other rows (of other lengths), when a step runs only the used rows."""

    def first_row(n: int) -> Any:
        batch = Batch(torch, cache_class, config, device, rows=rows, fixed=False)
        for i in range(n):
            prompt = [(97 + 31 * i + j) % config.vocab_size for j in range(3 + 2 * i)]
            cache = cache_class(config=config)
            model(input_ids=torch.tensor([prompt], device=device), past_key_values=cache, use_cache=True)
            seq: Any = SimpleNamespace(tokens=[*prompt, 42 + i])
            batch.add(seq, cache)
        return batch.step(model)[0]

    with torch.inference_mode():
        alone = first_row(1)
        return all(torch.equal(alone, first_row(n)) for n in range(2, rows + 1))
