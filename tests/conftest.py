"""Session fixtures: a real Triton (demo + test model repositories), the real services and the real
edge as separate processes on free loopback ports, started by the same code as `tritongate up`.

Only fixtures and the hooks that watch the session's Triton (its restart when a Python-backend stub has
died, the run's report on it) live here; the helpers are in tests/support.
Nothing here runs unless a test asks for it, so the unit tests start no Triton (see tests/README.md).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from launcher.stack import LocalStack
from tests.support.events import EVENTS_ENV, new_events_file
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer
from tests.support.stack import DEMO_LLM, TEST_REPOSITORIES, metrics_ports, stack_settings, write_model_config
from tests.support.stubs import dead, python_stubs
from tritongate.settings import default_cache_dir, default_models_dir
from tritongate.triton_local import TritonLaunch, TritonProcess, start_triton

if TYPE_CHECKING:  # imported where used: the unit tests need neither client
    import httpx
    import openai

# The session's own state folder: an edge's default store (a SQLite file there) starts empty in every run
# and never touches the user's; removed when the run ends. Each test stack has a store of its own in it.
_STATE_HOME = tempfile.TemporaryDirectory(prefix="tritongate-test-state-")
os.environ["XDG_STATE_HOME"] = _STATE_HOME.name


@pytest.fixture(scope="session")
def models_dir() -> Path:
    """The demo models, downloaded (and the LLM converted) on first use."""
    from tritongate.demo_models import fetch_models, missing_models

    directory = default_models_dir()
    if missing_models(directory):
        fetch_models(directory)
    return directory


@pytest.fixture(scope="session")
def tokenizer(models_dir: Path) -> Any:
    """The demo LLM's tokenizer, loaded once for the session (a module's own `tokenizer` fixture wins)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models_dir / DEMO_LLM)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real Redis server on a free loopback port (the shared-state tests' Redis/Valkey)."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def events_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Test models append what they observe (e.g. a cancelled request) here, one JSON per line."""
    return new_events_file(tmp_path_factory.mktemp("events"))


# What became of the session's Triton, for the summary of a failed run (see pytest_terminal_summary).
TRITON_FATE = pytest.StashKey[dict[str, Any]]()
SUMMARY_LOG_LINES = 40
RECONNECT_S = 3.0  # the services' channels retry a lost Triton at most every 2 s


@pytest.fixture(scope="session")
def triton(models_dir: Path, events_file: Path, tmp_path_factory: pytest.TempPathFactory,
           pytestconfig: pytest.Config) -> Iterator[TritonProcess]:
    ports = {"http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port()}
    logs = tmp_path_factory.mktemp("triton")

    def start(log_name: str) -> TritonProcess:
        return start_triton(TritonLaunch(repositories=list(TEST_REPOSITORIES), models_dir=models_dir,
                                         cache_dir=default_cache_dir(), log_path=logs / log_name,
                                         extra_env={EVENTS_ENV: str(events_file)}, **ports))

    process = start("tritonserver.log")
    fate: dict[str, Any] = {"process": process, "exit": None, "size": 0, "stubs": {}, "dead_stubs": [],
                            "restarts": [], "restart": None}

    def restart(why: str) -> None:
        """The same Triton again, on the same ports (every fixture holding `process` sees the new one)."""
        process.stop()
        fresh = start(f"tritonserver-{len(fate['restarts']) + 1}.log")
        fresh.wait_ready(600)
        process.process, process.log_path = fresh.process, fresh.log_path
        fate["stubs"] = python_stubs(fresh.process.pid)
        fate["restarts"].append(why)
        time.sleep(RECONNECT_S)

    pytestconfig.stash[TRITON_FATE] = fate
    try:
        process.wait_ready(600)
        fate.update(stubs=python_stubs(process.process.pid), restart=restart)
        yield process
    finally:
        fate["restart"] = None
        fate["exit"] = process.process.poll()  # None: it was still running when the session ended
        fate["dead_stubs"] = dead(fate["stubs"])
        with contextlib.suppress(OSError):
            fate["size"] = process.log_path.stat().st_size  # what it logged before it was stopped
        process.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before each test, a Triton that has exited, or that has a dead Python-backend stub, is restarted:
    Triton 2.51 neither restarts the stub nor reports its model not ready, so every later test of that
    model would fail. Both are upstream faults seen here: the stubs have died with SIGSEGV inside their own
    libpython under many concurrent streams, and tritonserver itself with SIGSEGV while streams were being
    cancelled (a race in its gRPC server, triton-inference-server/server#7840, fixed in 24.12); its orphaned
    stubs then take minutes to exit. The summary says when it happened."""
    fate = item.config.stash.get(TRITON_FATE, None)
    if fate is None or fate["restart"] is None:
        return
    if (code := fate["process"].process.poll()) is not None:
        fate["restart"](f"tritonserver had exited with code {code}")
    elif died := dead(fate["stubs"]):
        fate["restart"](f"the Python-backend stubs of {', '.join(died)} had died")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """After a failed run, whether the session's Triton died or any of its Python-backend stubs did, and
    the end of its log: one Triton (or stub) gone or wedged fails many tests at once, and a CI log may keep
    only this output."""
    fate = config.stash.get(TRITON_FATE, None)
    for why in [] if fate is None else fate["restarts"]:  # said whether the run failed or not
        terminalreporter.write_sep("-", f"Triton was restarted before a test: {why}")
    if fate is None or exitstatus == 0:
        return
    state = "still running" if fate["exit"] is None else f"had exited with code {fate['exit']}"
    if fate["dead_stubs"]:  # each of those models failed every request from then on
        terminalreporter.write_sep("-", "Python-backend stub processes that died during the session (of "
                                        f"{len(fate['stubs'])}): {', '.join(fate['dead_stubs'])}")
    log = fate["process"].log_path
    terminalreporter.write_sep("-", f"the session's Triton {state} at the end; its log until then ({log}):")
    try:
        lines = log.read_bytes()[:fate["size"]].decode(errors="replace").splitlines()
    except OSError as exc:
        terminalreporter.write_line(f"(its log could not be read: {exc})")
        return
    for line in lines[-SUMMARY_LOG_LINES:]:
        terminalreporter.write_line(line[:400])


@pytest.fixture(scope="session")
def model_config_file(triton: TritonProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/model_config.json (the format of Denglin's openai_api) pointed at the test Triton."""
    return write_model_config(triton.grpc_url, tmp_path_factory.mktemp("config"))


@pytest.fixture(scope="session")
def stack(triton: TritonProcess, model_config_file: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[LocalStack]:
    """The services and the edge on the session's Triton; logs under the pytest temp folder."""
    with LocalStack(stack_settings(model_config_file), triton=triton, log_dir=tmp_path_factory.mktemp("logs"),
                    metrics_ports=metrics_ports()) as local:
        yield local


@pytest.fixture(scope="session")
def client(stack: LocalStack) -> openai.OpenAI:
    import openai

    return openai.OpenAI(base_url=f"{stack.edge_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def http(stack: LocalStack) -> Iterator[httpx.Client]:
    import httpx

    with httpx.Client(base_url=stack.edge_url, timeout=120) as session:
        yield session
