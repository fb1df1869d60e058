"""Where the demo models run (tritongate/demo_models/device.py): the `device` and `dtype` parameters of
their config.pbtxt, chosen from what torch sees, and the LLM engine's tensors on the model's device.
No GPU is needed: torch's answers are monkeypatched, and the `meta` device stands in for a GPU."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritongate.demo_models import device
from tritongate.demo_models.device import choose_device, choose_dtype, cpu_has_bf16, placement
from tritongate.demo_models.llm_batch import Batch
from tritongate.demo_models.llm_core import Owner, Sequence
from tritongate.demo_models.llm_sampling import Sampling
from tritongate.settings import DEPLOY_DIR


@pytest.mark.parametrize(("setting", "cuda", "gpu_instance", "device"), [
    ("", False, None, "cpu"),  # no parameter: the CPU, as before
    ("", True, None, "cpu"),
    ("auto", False, None, "cpu"),
    ("auto", True, None, "cuda"),
    ("auto", True, 1, "cuda:1"),  # a KIND_GPU instance runs on the GPU Triton gave it
    ("cuda", True, 2, "cuda:2"),
    ("cuda:0", True, 2, "cuda:0"),  # a GPU named in the config wins
    ("cpu", True, 1, "cpu"),
    (" CUDA:3 ", True, None, "cuda:3"),
])
def test_the_device_follows_the_parameter_and_what_torch_sees(setting: str, cuda: bool, gpu_instance: int | None,
                                                              device: str) -> None:
    assert choose_device(setting, cuda, gpu_instance) == device


@pytest.mark.parametrize(("setting", "cuda", "message"), [
    ("gpu", True, "must be auto, cpu, cuda or cuda:N, got 'gpu'"),
    ("cuda:x", True, "must be auto, cpu, cuda or cuda:N"),
    ("cuda", False, "is 'cuda' but torch sees no GPU"),
    ("cuda:1", False, "torch sees no GPU"),
])
def test_a_device_that_cannot_be_used_is_refused(setting: str, cuda: bool, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        choose_device(setting, cuda)


@pytest.mark.parametrize(("setting", "device", "bf16", "dtype"), [
    ("auto", "cpu", False, "float32"),  # a CPU without bfloat16 arithmetic: float32
    ("", "cpu", True, "bfloat16"),  # one with it keeps the stored dtype
    ("bfloat16", "cpu", False, "bfloat16"),
    ("auto", "cuda", True, "bfloat16"),
    ("auto", "cuda:1", False, "float16"),  # a GPU without bfloat16
    ("bfloat16", "cuda", False, "bfloat16"),  # asked for: as asked
    ("float32", "cuda", True, "float32"),
])
def test_the_llm_dtype(setting: str, device: str, bf16: bool, dtype: str) -> None:
    assert choose_dtype(setting, device, cpu="bfloat16", cuda="bfloat16", bf16_supported=bf16) == dtype


def test_the_encoder_dtype_and_a_bad_dtype() -> None:
    assert choose_dtype("auto", "cpu", cpu="float32", cuda="float16") == "float32"
    assert choose_dtype("auto", "cuda", cpu="float32", cuda="float16", bf16_supported=False) == "float16"
    with pytest.raises(ValueError, match="parameter 'dtype' must be auto, float32, bfloat16, float16, got 'fp8'"):
        choose_dtype("fp8", "cuda", cpu="float32", cuda="float16")


def test_the_cpus_bfloat16_comes_from_its_flags(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n")
    assert not cpu_has_bf16(str(cpuinfo))
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile\n")
    assert cpu_has_bf16(str(cpuinfo))
    assert not cpu_has_bf16(str(tmp_path / "absent"))


def test_placement_asks_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert placement({"device": "auto", "dtype": "auto"}, cpu_dtype="bfloat16", cuda_dtype="bfloat16") == \
        (torch.device("cpu"), torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert placement({"device": "auto"}, cpu_dtype="bfloat16", cuda_dtype="bfloat16") == \
        (torch.device("cuda"), torch.float16)
    gpu_instance = {"model_instance_kind": "GPU", "model_instance_device_id": "1"}
    assert placement({"device": "auto"}, cpu_dtype="float32", cuda_dtype="float16", args=gpu_instance) == \
        (torch.device("cuda:1"), torch.float16)
    cpu_instance = {"model_instance_kind": "CPU", "model_instance_device_id": "0"}
    assert placement({}, cpu_dtype="float32", cuda_dtype="float16", args=cpu_instance) == \
        (torch.device("cpu"), torch.float32)


def test_every_demo_model_chooses_its_device() -> None:
    """Each demo model's config says `device: auto` and `dtype: auto`: the CPU here, a GPU where there is one."""
    configs = sorted([*(DEPLOY_DIR / "triton").glob("*/config.pbtxt"),
                      *(DEPLOY_DIR / "triton-llm-backends").glob("*/config.pbtxt")])
    assert len(configs) == 6
    for config in configs:
        parameters = text_format.Parse(config.read_text(), model_config_pb2.ModelConfig()).parameters
        assert (parameters["device"].string_value, parameters["dtype"].string_value) == ("auto", "auto"), config


class _Model:
    """Records what a decoding step feeds the model; answers with logits on the model's device."""

    def __init__(self) -> None:
        self.inputs: dict[str, Any] = {}

    def __call__(self, **inputs: Any) -> Any:
        self.inputs = inputs
        # a GPU model's logits are on the GPU; the meta device holds no data to copy, so the CPU here
        return SimpleNamespace(logits=torch.randn(len(inputs["input_ids"]), 1, 8))


def test_the_batch_feeds_the_model_and_indexes_its_cache_on_the_models_device() -> None:
    """The meta device stands in for a GPU: a tensor made on the CPU by mistake would show here (and mixing
    it with the cache's meta tensors would fail)."""
    from transformers import DynamicCache
    from transformers.models.llama import LlamaConfig

    config = LlamaConfig(num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=3, hidden_size=12)
    meta = torch.device("meta")

    def cache(length: int) -> Any:
        return DynamicCache([(torch.zeros(1, 3, length, 4, device=meta),) * 2 for _ in range(2)], config=config)

    batch = Batch(torch, DynamicCache, config, meta, rows=3)
    for prompt in ([1, 2, 3], [4, 5]):
        batch.add(Sequence(prompt, Sampling(max_new_tokens=4), Owner()), cache(len(prompt)))
    model = _Model()
    logits = batch.step(model)
    assert logits.shape == (3, 8) and logits.device.type == "cpu"  # tokens are chosen on the CPU
    assert model.inputs["input_ids"].device == meta and model.inputs["position_ids"].device == meta
    assert model.inputs["row_starts"] == [0, 1, None]  # the shorter prompt is left-padded by one; a free row
    batch.copy([1], [0])  # a beam taking over another's keys and values, on their device
    batch.drop([0])  # the padding no row needs goes
    assert batch.cache.layers[0].keys.device == meta and batch.cache.layers[0].keys.shape == (3, 3, 2, 4)
    assert batch.starts == [None, 0, None]
