"""LoRA adapters on the whole stack, through the openai SDK: each adapter of `tests/model_config.json` is a
model of its own in /v1/models (`parent`: its base), runs on its base's Triton model with the backend's
LoRA inputs (what the echo models report in the events file: TensorRT-LLM's task id and the weights of
`tests/lora/`, sent again when the backend's cache lost them; vLLM's `lora_name`), and tokenizes with its
base's tokenizer. The echo models generate the same text whatever the adapter."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.support.events import events_offset, read_events

LORA = Path(__file__).resolve().parents[1] / "lora"


@dataclass(frozen=True)
class Base:
    model: str
    echo: str  # its Triton model, which writes the events
    adapters: dict[str, str]  # model id -> the folder of tests/lora (TensorRT-LLM) or the lora_name (vLLM)
    task_ids: dict[str, int] | None = None  # the `task_id`s the config gives (the others derive from `path`)

    def __str__(self) -> str:
        return self.model


TRTLLM = [Base("trtllm-echo-lora", "trtllm-echo", {"trtllm-doll": "doll", "trtllm-sheep": "sheep"},
               {"trtllm-sheep": 7}),
          Base("trtllm-text-echo-lora", "trtllm-text-echo", {"trtllm-text-doll": "doll", "trtllm-text-sheep": "sheep"})]
VLLM = Base("vllm-echo-lora", "vllm-echo", {"doll": "doll", "sheep": "sheep", "vllm-echo-lora_lora_doll": "doll"})
ALL = [*TRTLLM, VLLM]
MESSAGES: Any = [{"role": "user", "content": "one two three"}]


def chat(client: openai.OpenAI, model: str, **extra: Any) -> tuple[str, str]:
    """The reply's text and the request id (Triton's request id is `<it>-0`)."""
    request_id = uuid.uuid4().hex
    reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, temperature=0,
                                           extra_headers={"X-Request-ID": request_id}, **extra)
    return reply.choices[0].message.content or "", f"{request_id}-0"


def events_of(events_file: Path, offset: int, request_id: str) -> list[dict[str, Any]]:
    return [e for e in read_events(events_file, offset) if e["request_id"] == request_id]


def test_adapters_are_listed_with_their_base_as_parent(client: openai.OpenAI, http: httpx.Client) -> None:
    listed = {model["id"]: model for model in http.get("/v1/models").json()["data"]}
    for base in ALL:
        assert listed[base.model]["parent"] is None
        for adapter in base.adapters:
            assert (listed[adapter]["parent"], listed[adapter]["root"]) == (base.model, adapter)
            assert listed[adapter]["max_model_len"] == listed[base.model]["max_model_len"]
    assert "ft-doll" in listed and "trtllm-echo-lora_lora_trtllm-doll" not in listed  # no separator there
    model = client.models.retrieve("vllm-echo-lora_lora_doll")
    assert (model.id, (model.model_extra or {}).get("parent")) == ("vllm-echo-lora_lora_doll", "vllm-echo-lora")


@pytest.mark.parametrize("base", TRTLLM, ids=str)
def test_tensorrt_llm_gets_the_task_id_and_the_weights_once_and_again_when_evicted(
        client: openai.OpenAI, events_file: Path, base: Base) -> None:
    # The echo's LoRA cache holds one adapter (lora_cache_size 1): each adapter evicts the other.
    doll, sheep = base.adapters
    expected = chat(client, base.model)[0]
    seen: list[tuple[str, dict[str, Any]]] = []
    for adapter in (sheep, doll, doll, sheep):
        offset = events_offset(events_file)
        text, request_id = chat(client, adapter)
        assert text == expected  # the echo ignores the adapter; the request went through
        events = events_of(events_file, offset, request_id)
        completed = next(e for e in events if e["event"] == "completed")
        assert completed["model"] == base.echo
        seen.append((adapter, completed))
        folder = LORA / base.adapters[adapter]
        weights, config = (np.load(folder / f"model.lora_{name}.npy") for name in ("weights", "config"))
        assert completed["lora_weights_shape"] == list(weights.shape)  # [1, rows, size]: the model batches
        assert completed["lora_weights_sum"] == float(weights.astype(np.float64).sum())
        assert (completed["lora_config_shape"], completed["lora_config_sum"]) == (list(config.shape), int(config.sum()))
        if len(seen) == 3:  # doll again, still cached: the task id alone
            assert not completed["lora_weights_sent"] and not [e for e in events if e["event"] == "lora_not_cached"]
        if len(seen) == 4:  # sheep, sent before but evicted by doll: refused, then sent again with its weights
            assert [e["event"] for e in events] == ["lora_not_cached", "completed"] and completed["lora_weights_sent"]
    task_ids = {adapter: completed["lora_task_id"] for adapter, completed in seen}  # the same on each request
    assert len({completed["lora_task_id"] for _, completed in seen}) == len(task_ids) == 2
    assert task_ids.items() >= (base.task_ids or {}).items()
    assert seen[1][1]["lora_weights_sent"]  # doll after sheep: sent, or refused and sent again


def test_vllm_gets_the_lora_name_by_either_model_id(client: openai.OpenAI, events_file: Path) -> None:
    offset = events_offset(events_file)
    base_text, base_request = chat(client, VLLM.model)
    assert "lora_name" not in events_of(events_file, offset, base_request)[0]
    for adapter, lora_name in VLLM.adapters.items():
        offset = events_offset(events_file)
        text, request_id = chat(client, adapter)
        assert text == base_text
        assert [(e["model"], e["lora_name"]) for e in events_of(events_file, offset, request_id)] == [
            (VLLM.echo, lora_name)]


@pytest.mark.parametrize("base", ALL, ids=str)
def test_adapters_stream_complete_and_tokenize_as_their_base(client: openai.OpenAI, http: httpx.Client,
                                                              base: Base) -> None:
    adapter = next(iter(base.adapters))
    streamed = client.chat.completions.create(model=adapter, messages=MESSAGES, max_tokens=4, temperature=0,
                                              stream=True)
    chunks = list(streamed)
    assert {chunk.model for chunk in chunks} == {adapter}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat(client, base.model)[0]
    completion = client.completions.create(model=adapter, prompt="red green blue", max_tokens=3, temperature=0)
    assert (completion.model, completion.choices[0].text) == (adapter, "red green blue")
    for body in ({"prompt": "red green blue"}, {"messages": MESSAGES}):
        tokens = http.post("/tokenize", json={"model": adapter, **body}).json()
        assert tokens == http.post("/tokenize", json={"model": base.model, **body}).json()
    detokenized = http.post("/detokenize", json={"model": adapter, "tokens": tokens["tokens"]}).json()
    assert detokenized == http.post("/detokenize", json={"model": base.model, "tokens": tokens["tokens"]}).json()


@pytest.mark.parametrize("model", ["no-such-adapter", "vllm-echo-lora_lora_nope", "trtllm-echo-lora_lora_trtllm-doll"])
def test_an_adapter_that_does_not_exist_is_an_unknown_model(client: openai.OpenAI, http: httpx.Client,
                                                            model: str) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2)
    assert raised.value.body == {"message": f"The model `{model}` does not exist.", "type": "invalid_request_error",
                                 "param": "model", "code": "model_not_found"}
    assert http.post("/tokenize", json={"model": model, "prompt": "x"}).status_code == 404


def test_an_adapter_on_a_backend_without_lora_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model="ft-doll", prompt="red green", max_tokens=2)
    assert raised.value.param == "model" and "cannot run LoRA adapters" in raised.value.message
