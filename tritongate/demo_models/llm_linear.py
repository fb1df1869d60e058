"""The demo LLM's matrix products on the CPU: oneDNN with its weights reordered once (`pack_linears`).

Two reasons. Speed: PyTorch's default float32 CPU matrix product (MKL) takes about twice as long for 4
rows as for 1 (on the AMD EPYC this was measured on; for 2 rows, longer still), where oneDNN's reordered
weights serve 4 rows for about 1.3 times the cost of 1. Batch-independence: with oneDNN's reordered
weights a row's result was bitwise the same whatever the number of rows in the product, where MKL's 1-, 2-,
3- and 4-or-more-row kernels each round differently. The engine does not take the second on trust: it
checks it on the real model when it loads (llm_core.Engine, `Batch.fixed`).

Runs inside Triton's Python backend (see llm_core): torch is imported when first needed.
"""

from __future__ import annotations

from typing import Any


def pack_linears(model: Any, rows: int) -> bool:
    """Replace the forward of every `torch.nn.Linear` of a float32 CPU `model` by oneDNN's, on weights
    reordered for `rows` rows; False (nothing changed) where oneDNN is not there or the model is elsewhere."""
    import torch

    reorder = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
    first = next(model.parameters())
    if not torch.backends.mkldnn.is_available() or reorder is None or first.device.type != "cpu" \
            or first.dtype != torch.float32:
        return False
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            packed = reorder(module.weight.detach(), rows)
            bias = None if module.bias is None else module.bias.detach()
            module.forward = _packed_forward(packed, bias)  # type: ignore[method-assign]
            # the plain weight is no longer read (an embedding tied to it keeps its own reference)
            module.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    return True


def _packed_forward(packed: Any, bias: Any) -> Any:
    import torch

    def forward(x: Any) -> Any:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    return forward
