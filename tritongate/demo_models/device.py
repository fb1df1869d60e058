"""Where a demo model runs: the `device` and `dtype` parameters of its config.pbtxt.

`device` is `auto` (CUDA when torch sees a GPU, else the CPU), `cpu`, `cuda` or `cuda:N`; a Triton
instance of kind KIND_GPU runs on its own GPU (`cuda:<model_instance_device_id>`) unless `device` names
one. `dtype` is `auto` (the model's CPU dtype on the CPU, bfloat16 falling back to float32 where the CPU has
no bfloat16 arithmetic; on CUDA its GPU dtype, bfloat16 falling back to float16 where the GPU has none),
`float32`, `bfloat16` or `float16`. Without the parameters a model runs on the CPU in its CPU dtype.

A CPU without bfloat16 instructions (avx512_bf16 or AMX on x86) converts every bfloat16 weight to float32
to multiply it: a prompt's prefill is about 5 times slower there than in float32.

The choice is pure (`choose_device`, `choose_dtype`); `placement` asks torch. Standard library only at
import: this runs inside Triton's Python backend (see llm_core).
"""

from __future__ import annotations

import re
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")


def choose_device(setting: str, cuda_available: bool, gpu_instance: int | None = None) -> str:
    """The torch device for a `device` parameter ("" means cpu). `gpu_instance`: the GPU Triton gave a
    KIND_GPU instance. ValueError for an unknown setting or a GPU that torch does not see."""
    name = (setting or "cpu").strip().lower()
    if name == "auto":
        name = "cuda" if cuda_available or gpu_instance is not None else "cpu"
    if name == "cuda" and gpu_instance is not None:
        name = f"cuda:{gpu_instance}"
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise ValueError(f"parameter 'device' must be auto, cpu, cuda or cuda:N, got {setting!r}")
    if name != "cpu" and not cuda_available:
        raise ValueError(f"parameter 'device' is {setting!r} but torch sees no GPU")
    return name


def choose_dtype(setting: str, device: str, *, cpu: str, cuda: str, bf16_supported: bool = True) -> str:
    """The torch dtype name for a `dtype` parameter ("" means auto): `cpu` on the CPU, `cuda` on a GPU.
    `bf16_supported`: whether the device computes in bfloat16 natively."""
    name = (setting or "auto").strip().lower()
    if name == "auto":
        name = cpu if device == "cpu" else cuda
        if name == "bfloat16" and not bf16_supported:
            # emulated: a CPU without avx512_bf16 or AMX, a V100 or T4
            name = "float32" if device == "cpu" else "float16"
    if name not in DTYPES:
        raise ValueError(f"parameter 'dtype' must be auto, {', '.join(DTYPES)}, got {setting!r}")
    return name


def placement(parameters: dict[str, str], *, cpu_dtype: str, cuda_dtype: str,
              args: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """(torch.device, torch dtype) for a model's config parameters and Triton's `initialize` args."""
    import torch

    args = args or {}
    gpu_instance = int(args["model_instance_device_id"]) if args.get("model_instance_kind") == "GPU" else None
    device = choose_device(parameters.get("device", ""), torch.cuda.is_available(), gpu_instance)
    bf16 = cpu_has_bf16() if device == "cpu" else torch.cuda.is_bf16_supported()
    dtype = choose_dtype(parameters.get("dtype", ""), device, cpu=cpu_dtype, cuda=cuda_dtype, bf16_supported=bf16)
    return torch.device(device), getattr(torch, dtype)


# /proc/cpuinfo flags of a CPU that computes in bfloat16 (x86: AVX512-BF16, AMX); elsewhere None: unknown
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_has_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU has bfloat16 arithmetic (on Linux, from its flags; False where they cannot be read,
    so the CPU runs the always fast float32)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as file:
            flags = next((line.split(":", 1)[1].split() for line in file if line.startswith(("flags", "Features"))), [])
    except OSError:
        return False
    return any(flag in flags for flag in (*BF16_FLAGS, "bf16"))  # "bf16": arm64's Features
