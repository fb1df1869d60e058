"""LoRA adapters: `llm[].lora_adapters` and `lora_separator` in the model config, the model ids they add,
and what each backend is sent (TensorRT-LLM: the task id, the weights once and again when its cache lost
them; vLLM: `lora_name`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.common.errors import ServiceError
from services.llm.backends import Sampling
from services.llm.lora import Adapter, TaskCache, adapters_of, task_id_of
from services.llm.tensorrt_llm import TensorRTLLM
from services.llm.tensors import ModelInterface
from services.llm.vllm import Vllm
from tests.support.fake_triton import FakeModel, FakeTriton, Refused, triton_config
from tests.unit.test_llm_tensorrt_llm import INPUTS, OUTPUTS, response
from tritongate.config import ConfigError, LlmModel, load_model_config, parse_model_config

LORA_INPUTS = {"lora_task_id": "UINT64", "lora_weights": "FP16", "lora_config": "INT32"}
LORA = Path(__file__).resolve().parents[1] / "lora"


def llm(**fields: Any) -> dict[str, Any]:
    return {"name": "base", "url": "t:8001", "path": "/m", **fields}


def test_adapters_are_model_ids_of_their_own_and_with_a_separator_also_base_sep_adapter(tmp_path: Path) -> None:
    file = tmp_path / "model_config.json"
    file.write_text(json.dumps({"llm": [llm(lora_adapters={"sql": {"path": "adapters/sql"}, "chat": {"task_id": 3},
                                                         "doll": {}}, lora_separator="_lora_")]}))
    entry = load_model_config(file).llm[0]
    assert entry.lora_adapters["sql"].path == str(tmp_path / "adapters/sql")  # relative to the config file
    assert entry.adapter_ids() == {"sql": "sql", "chat": "chat", "doll": "doll", "base_lora_sql": "sql",
                                   "base_lora_chat": "chat", "base_lora_doll": "doll"}
    adapters = adapters_of(entry)
    assert adapters["base_lora_sql"] is adapters["sql"]
    assert (adapters["sql"].task_id, adapters["sql"].lora_name) == (task_id_of(str(tmp_path / "adapters/sql")), "sql")
    assert (adapters["chat"].task_id, adapters["chat"].path) == (3, None)
    assert adapters["doll"].task_id == 0  # vLLM's only: no task id for TensorRT-LLM
    assert LlmModel.model_validate(llm(lora_name="fixed")).adapter_ids() == {}  # the one fixed adapter stays


def test_derived_task_ids_are_stable_distinct_and_fit_uint64() -> None:
    ids = {task_id_of(f"/adapters/{n}") for n in range(200)}
    assert len(ids) == 200 and all(0 < i < 2**63 for i in ids) and task_id_of("/adapters/0") in ids


@pytest.mark.parametrize(("config", "message"), [
    ({"llm": [llm(lora_adapters={"base": {}})]}, "$.llm[0].lora_adapters.base: model id 'base' is already used"),
    ({"llm": [llm(), llm(name="other", lora_adapters={"base": {}})]}, "lora_adapters.base: model id 'base'"),
    ({"llm": [llm(lora_adapters={"a": {}}, lora_separator="-"), llm(name="base-a")]}, "model id 'base-a'"),
    ({"llm": [llm(lora_adapters={"a": {"task_id": 0}})]}, "$.llm[0].lora_adapters.a.task_id"),
    ({"llm": [llm(lora_separator="")]}, "$.llm[0].lora_separator"),
])
def test_clashing_ids_and_bad_fields_are_config_errors(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_model_config(config)
    assert message in str(raised.value)


def weights_folder(tmp_path: Path, rows: int = 2, batch: bool = True) -> str:
    weights = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    config = np.array([[1, layer, 2] for layer in range(rows)], dtype=np.int64)
    np.save(tmp_path / "model.lora_weights.npy", weights[np.newaxis] if batch else weights)
    np.save(tmp_path / "model.lora_config.npy", config[np.newaxis] if batch else config)
    return str(tmp_path)


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("file_batch", [True, False])
def test_weights_go_once_in_the_declared_types_and_shapes(tmp_path: Path, batched: bool, file_batch: bool) -> None:
    model = ModelInterface(triton_config(LORA_INPUTS, {}, batched=batched))
    adapter = Adapter("a", "a", 5, weights_folder(tmp_path, batch=file_batch))
    cache = TaskCache()
    first = cache.tensors(adapter, model)
    lead = (1,) if batched else ()
    assert first["lora_task_id"].dtype == np.uint64 and first["lora_task_id"].shape == (*lead, 1)
    assert first["lora_weights"].dtype == np.float16 and first["lora_weights"].shape == (*lead, 2, 4)
    assert first["lora_config"].dtype == np.int32 and first["lora_config"].shape == (*lead, 2, 3)
    assert first["lora_weights"].reshape(-1).tolist() == list(range(8))
    assert cache.tensors(adapter, model).keys() == {"lora_task_id"}  # sent: the id alone from now on
    assert cache.tensors(adapter, model, resend=True).keys() == first.keys()
    assert cache.tensors(None, model) == {}


def test_an_adapter_without_task_id_or_readable_weights_cannot_run_on_tensorrt_llm(tmp_path: Path) -> None:
    model = ModelInterface(triton_config(LORA_INPUTS, {}))
    with pytest.raises(ServiceError, match="neither `path` nor `task_id`"):
        TaskCache().tensors(Adapter("doll", "doll", 0, None), model)
    with pytest.raises(ServiceError, match="cannot read its weights"):
        TaskCache().tensors(Adapter("a", "a", 5, str(tmp_path / "missing")), model)


def sampling(adapter: Adapter | None) -> Sampling:
    return Sampling(max_new_tokens=2, greedy=True, end_id=2, adapter=adapter)


def lora_model(cached: set[int]) -> FakeModel:
    """A `tensorrt_llm` model whose LoRA cache holds `cached` task ids (and what comes with weights)."""

    def answer(inputs: Mapping[str, np.ndarray]) -> Iterable[dict[str, np.ndarray]]:
        if "lora_task_id" in inputs:
            task = int(inputs["lora_task_id"].reshape(-1)[0])
            if "lora_weights" in inputs:
                cached.add(task)
            elif task not in cached:
                raise Refused(f"[TensorRT-LLM][ERROR] LoRA task {task} not found in cache. Please send LoRA "
                              "weights with request")
        return [response([20, 21])]

    return FakeModel(triton_config({**INPUTS, **LORA_INPUTS}, OUTPUTS), answer)


async def test_tensorrt_llm_sends_the_weights_again_when_its_cache_lost_them(tmp_path: Path) -> None:
    cached: set[int] = set()
    adapter = Adapter("a", "a", 9, weights_folder(tmp_path))
    async with FakeTriton({"m": lora_model(cached)}) as triton:
        trt = TensorRTLLM(*await triton.calling("m"), "m")
        trt.configure(triton.models["m"].config)
        assert trt.supports("lora")

        async def run(adapter: Adapter | None) -> list[list[int]]:
            return [step.token_ids async for step in trt.stream([7, 8], sampling(adapter), None)]

        assert await run(adapter) == await run(adapter) == await run(None) == [[20, 21]]
        cached.clear()  # evicted, or Triton restarted
        assert await run(adapter) == [[20, 21]]
    sent = [(int(r.inputs["lora_task_id"].reshape(-1)[0]) if "lora_task_id" in r.inputs else None,
             "lora_weights" in r.inputs) for r in triton.requests]
    assert sent == [(9, True), (9, False), (None, False), (9, False), (9, True)]


async def test_other_failures_of_an_adapter_request_are_not_retried(tmp_path: Path) -> None:
    def answer(inputs: Mapping[str, np.ndarray]) -> Iterable[dict[str, np.ndarray]]:
        raise Refused("LoRA task 9 not found in cache. Please send LoRA weights with request")

    async with FakeTriton({"m": FakeModel(triton_config({**INPUTS, **LORA_INPUTS}, OUTPUTS), answer)}) as triton:
        trt = TensorRTLLM(*await triton.calling("m"), "m")
        trt.configure(triton.models["m"].config)
        with pytest.raises(ServiceError, match="not found in cache"):  # even with the weights: the error stands
            [step async for step in trt.stream([7], sampling(Adapter("a", "a", 9, weights_folder(tmp_path))), None)]
    assert [("lora_weights" in r.inputs) for r in triton.requests] == [True]


def test_backends_without_lora_inputs_do_not_support_adapters() -> None:
    trt = TensorRTLLM(None, None, "m")  # type: ignore[arg-type]
    trt.configure(triton_config(INPUTS, OUTPUTS))
    assert not trt.supports("lora")


def test_vllm_gets_the_adapters_lora_name_else_the_models_fixed_one() -> None:
    vllm = Vllm(None, None, "m", lora_name="fixed")  # type: ignore[arg-type]
    vllm.configure(triton_config({"text_input": "STRING", "sampling_parameters": "STRING"}, {"text_output": "STRING"},
                                 batched=False))

    def lora_name(adapter: Adapter | None) -> str | None:
        params = json.loads(vllm.tensors("Hi", sampling(adapter))["sampling_parameters"][0])
        return params.get("lora_name")  # type: ignore[no-any-return]

    assert vllm.supports("lora")
    assert (lora_name(None), lora_name(Adapter("doll", "doll-v2", 0, None))) == ("fixed", "doll-v2")


def test_the_test_adapters_are_in_hf_lora_convert_layout() -> None:
    for name in ("doll", "sheep"):
        weights, config = (np.load(LORA / name / f"model.lora_{kind}.npy") for kind in ("weights", "config"))
        assert weights.dtype == np.float16 and config.dtype == np.int32
        assert weights.ndim == config.ndim == 3 and weights.shape[:2] == config.shape[:2] and config.shape[2] == 3
