"""lm-evaluation-harness itself against the stack: its `local-completions` model scores a small
multiple-choice task (written here: a task YAML and a local JSON Lines dataset, no network) on the demo
TensorRT-LLM id, through /v1/completions with `echo` and `logprobs` (the prompt's log probabilities from
the context logits). Every loglikelihood it got must match the same weights in transformers within the
dtype's tolerance, and so must its accuracy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.stack import DEMO_LLMS, LocalStack
from tests.support.reference_lm import ReferenceLM
from tests.support.stack import DEMO_LLM

MODEL = DEMO_LLMS["tensorrt_llm"]
TASK = "tritongate_capitals"
DOCS = [
    {"country": "France", "choices": ["Paris", "Berlin", "Madrid"], "answer": 0},
    {"country": "Italy", "choices": ["Vienna", "Rome", "Lisbon"], "answer": 1},
    {"country": "Germany", "choices": ["Warsaw", "Prague", "Berlin"], "answer": 2},
    {"country": "Japan", "choices": ["Tokyo", "Seoul", "Beijing"], "answer": 0},
    {"country": "Spain", "choices": ["Athens", "Madrid", "Dublin"], "answer": 1},
    {"country": "the United Kingdom", "choices": ["Oslo", "Brussels", "London"], "answer": 2},
]
TASK_YAML = """\
task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: What is the capital of {{{{country}}}}?\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("lm_eval_task")
    data = folder / "capitals.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS), encoding="utf-8")
    (folder / f"{TASK}.yaml").write_text(TASK_YAML.format(task=TASK, data=data), encoding="utf-8")
    return folder


def test_lm_eval_loglikelihoods_and_accuracy_match_the_weights(stack: LocalStack, models_dir: Path, task_dir: Path,
                                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    lm = LocalCompletionsAPI(model=MODEL, base_url=f"{stack.edge_url}/v1/completions",
                             tokenizer=str(models_dir / DEMO_LLM), tokenizer_backend="huggingface",
                             num_concurrent=1, max_retries=1)
    results: dict[str, Any] = lm_eval.simple_evaluate(model=lm, tasks=[TASK], log_samples=True,
                                                      task_manager=TaskManager(include_path=str(task_dir)))
    samples = results["samples"][TASK]
    assert len(samples) == len(DOCS)

    reference = ReferenceLM.load(models_dir)
    correct = 0
    for sample in sorted(samples, key=lambda s: s["doc_id"]):
        pairs = [(request["arg_0"], request["arg_1"]) for request in sample["arguments"].values()] \
            if isinstance(sample["arguments"], dict) else [tuple(args) for args in sample["arguments"]]
        served = [float(response[0][0]) for response in sample["resps"]]
        expected = [reference.loglikelihood(*lm._encode_pair(context, continuation)) for context, continuation in pairs]
        assert served == pytest.approx(expected, abs=reference.tolerance * 2), sample["doc"]
        correct += int(max(range(len(expected)), key=expected.__getitem__) == sample["doc"]["answer"])
        assert sample["acc"] == float(max(range(len(served)), key=served.__getitem__) == sample["doc"]["answer"])
    assert results["results"][TASK]["acc,none"] == pytest.approx(correct / len(DOCS))
