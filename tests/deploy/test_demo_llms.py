"""The demo LLM behind each Triton LLM interface: deploy/model_config.all.json is the demo configuration
plus the three other interfaces, and every one of its LLMs is a Triton model of the demo repositories."""

from __future__ import annotations

import json
import re

from launcher.stack import ALL_DEMO_LLMS_CONFIG, DEFAULT_CONFIG, DEMO_LLM_REPOSITORY, DEMO_LLMS
from tritongate.settings import DEPLOY_DIR


def test_the_all_config_is_the_demo_config_plus_the_other_interfaces() -> None:
    demo, every = json.loads(DEFAULT_CONFIG.read_text()), json.loads(ALL_DEMO_LLMS_CONFIG.read_text())
    assert {k: v for k, v in every.items() if k not in ("llm", "model_infos")} == \
        {k: v for k, v in demo.items() if k not in ("llm", "model_infos")}
    assert every["llm"][: len(demo["llm"])] == demo["llm"]
    assert every["model_infos"][: len(demo["model_infos"])] == demo["model_infos"]
    by_name = {entry["name"]: entry for entry in every["llm"]}
    assert list(by_name) == list(DEMO_LLMS.values())
    for backend, name in DEMO_LLMS.items():
        assert by_name[name].get("backend", "fastertransformer") == backend
        assert any(info["name"] == name for info in every["model_infos"])


def test_every_demo_llm_is_a_triton_model_of_its_name() -> None:
    for backend, name in DEMO_LLMS.items():
        repository = DEPLOY_DIR / "triton" if backend == "fastertransformer" else DEMO_LLM_REPOSITORY
        config = (repository / name / "config.pbtxt").read_text()
        assert re.search(rf'^name: "{name}"$', config, flags=re.M), name
        assert re.search(r"^\s*decoupled: true$", config, flags=re.M), name
        assert (repository / name / "1" / "model.py").is_file()
    # deploy/triton (also the Triton image's repository, compose's) holds only the FasterTransformer one;
    # `tritongate up` loads the others from DEMO_LLM_REPOSITORY by name.
    assert not {p.name for p in DEMO_LLM_REPOSITORY.iterdir()} & {p.name for p in (DEPLOY_DIR / "triton").iterdir()}
