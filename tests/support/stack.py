"""The test stack: its model repositories and configuration, its settings on free ports, and one
component spawned on its own (`python -m launcher.cli ...`) beside it."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from launcher.stack import ALL_DEMO_LLMS_CONFIG, DEMO_LLM_REPOSITORY
from tests.support.backends import ECHO_MODELS, echo_variants
from tests.support.ports import free_port
from tritongate.registry import NAMES, SERVICES
from tritongate.settings import DEPLOY_DIR, Settings, default_state_url

TESTS = Path(__file__).resolve().parents[1]
# The test Triton serves the demo models, the demo LLM behind each Triton LLM interface (what
# `tritongate up --demo-llm all` adds) and the test models (the echo models).
TEST_REPOSITORIES = (DEPLOY_DIR / "triton", DEMO_LLM_REPOSITORY, TESTS / "triton_models")
# The demo LLM (a folder of the model cache); its tokenizer is the one the LLM tests use.
DEMO_LLM = "smollm2-135m-instruct"
# The test stack's request body limit (smaller than the default, so that tests can exceed it cheaply).
BODY_LIMIT = 4 * 1024 * 1024


def write_model_config(triton_grpc_url: str, directory: Path) -> Path:
    """tests/model_config.json (the format of Denglin's openai_api) with every model pointed at the given
    Triton, plus the demo LLMs of `tritongate up --demo-llm all` and each echo model's `-slow` and
    `-failing` variants (tests.support.backends), written to `directory`."""
    config = json.loads((TESTS / "model_config.json").read_text())
    infos = {info["name"]: info for info in config["model_infos"]}
    demo = json.loads(ALL_DEMO_LLMS_CONFIG.read_text())
    for entry in demo["llm"]:  # a demo template file is relative to deploy/, where that file is
        if "chat_template" in entry:
            entry["chat_template"] = str(ALL_DEMO_LLMS_CONFIG.parent / entry["chat_template"])
    config["llm"] += [entry for entry in demo["llm"] if entry["name"] not in infos]
    config["model_infos"] += [info for info in demo["model_infos"] if info["name"] not in infos]
    for entry in [entry for entry in config["llm"] if entry["name"] in ECHO_MODELS]:
        for variant in echo_variants(entry):
            if variant["name"] in infos:  # written out in the file (other tests read it directly)
                continue
            config["llm"].append(variant)
            config["model_infos"].append(dict(infos[entry["name"]], name=variant["name"]))
    for service in SERVICES:
        for entry in config.get(service.section, []):
            entry["url"] = triton_grpc_url
            if "chat_template" in entry:  # relative to tests/, where the template files are (else absolute)
                entry["chat_template"] = str(TESTS / entry["chat_template"])
            for adapter in entry.get("lora_adapters", {}).values():  # also relative to tests/ (tests/lora)
                if "path" in adapter:
                    adapter["path"] = str(TESTS / adapter["path"])
    path = directory / "model_config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def private_state_url() -> str:
    """A shared-state store of its own for one stack: a new SQLite file beside the default one."""
    default = Path(urlsplit(default_state_url()).path)
    return f"sqlite://{default.with_name(f'edge-state-{uuid.uuid4().hex}.sqlite3')}"


def stack_settings(config_file: Path, **overrides: object) -> Settings:
    """Settings for a stack on free loopback ports (the edge's and every service's), with a state store
    of its own."""
    ports = {f"{name}_port": free_port() for name in ("edge", *NAMES)}
    overrides.setdefault("state_url", private_state_url())
    return Settings(config_file=config_file, max_body_bytes=BODY_LIMIT, **ports, **overrides)  # type: ignore[arg-type]


def metrics_ports() -> dict[str, int]:
    """A free metrics port for each service (LocalStack's `metrics_ports`)."""
    return {name: free_port() for name in NAMES}


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`tritongate *args` as a child process, its output to `log`; an edge has a state store of its own
    unless `env` names one."""
    env = {"TRITONGATE_STATE_URL": private_state_url(), **env}
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "launcher.cli", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
