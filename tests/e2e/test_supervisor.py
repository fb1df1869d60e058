"""`tritongate up` heals: the real command (`python -m launcher.cli up`) as a child process on free ports,
with its own Triton serving the echo LLM and the MiniLM models, one process per service, two edge workers,
and its output captured.

- Under load (chat, embeddings and rerank requests in a loop), each service process and then one edge
  worker is SIGKILLed in turn: each comes back (its port answers again), the log says which one was
  restarted, and no request to another service's model fails meanwhile. Requests to the killed service's
  model may get a 503 (`service_unavailable`) until it is back. A request that fails with a connection error is
  retried once on a new connection half a second later (the killed edge worker's requests in flight or in
  its accept queue: a connection opened at once may still land there); the retry must succeed.
- SIGINT while a restart waits for its delay stops everything: no process of the stack remains, nor the
  edge workers' metrics directory.
- A smaller stack (the echo LLM only): Triton SIGKILLed comes back on its ports, without its old stubs or
  their shared memory; then the LLM service, its model configuration made invalid, cannot start again and
  stops the stack with the reason and a non-zero exit code, leaving nothing behind.
- `tritongate edge --workers 2` restarts a killed worker the same way, and stops with the reason when its
  workers cannot bind the port.

The tests of a module-scoped stack run in file order: the last one stops it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge.channels import MAX_RECONNECT_BACKOFF_MS
from launcher.stack import grpc_serving, http_ok
from tests.support.load import Load, Outcome
from tests.support.ports import free_port, wait_until
from tests.support.stack import TESTS
from tritongate import procs
from tritongate.settings import DEPLOY_DIR
from tritongate.triton_local import python_backend_shm

CHAT, EMBED, RERANK = "ft-echo", "all-minilm-l6-v2", "minilm-rerank"
MODELS = {"llm": (TESTS / "triton_models" / CHAT, "llm"), "embed": (DEPLOY_DIR / "triton" / EMBED, "embedding"),
          "rerank": (DEPLOY_DIR / "triton" / RERANK, "rerank")}
REQUESTS = {"llm": ("/v1/chat/completions", {"model": CHAT, "messages": [{"role": "user", "content": "hi"}],
                                             "max_tokens": 4}),
            "embed": ("/v1/embeddings", {"model": EMBED, "input": ["load", "more load"]}),
            "rerank": ("/v1/rerank", {"model": RERANK, "query": "q", "documents": ["a", "b"]})}
START_S = 600  # Triton loads the models: generous, never a timing assertion
BACK_S = 180


# The process tree, from /proc.

def descendants(pid: int) -> set[int]:
    processes = procs.processes()
    found: set[int] = set()
    parents = {pid}
    while parents:
        children = {child for child, fields in processes.items() if int(fields[1]) in parents} - found
        found |= children
        parents = children
    return found


def role(pid: int) -> str:
    """`triton`, or the component of `python -m launcher.cli <component>`; "" for anything else."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return ""
    if args[0].endswith("/tritonserver"):
        return "triton"
    return args[3] if args[1:3] == ["-m", "launcher.cli"] and len(args) > 3 else ""


def listens(pid: int, port: int) -> bool:
    """Whether `pid` holds a socket listening on `port`."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def metrics_dir(pid: int) -> Path:
    environ = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return Path(next(item.split("=", 1)[1] for item in environ if item.startswith("PROMETHEUS_MULTIPROC_DIR=")))


# A command under test.

@dataclass
class Command:
    """A `tritongate` command running as a child process, its output in `log`."""

    process: subprocess.Popen[bytes]
    log: Path
    edge_port: int
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.edge_port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def pids(self, component: str) -> list[int]:
        return sorted(pid for pid in descendants(self.process.pid) if role(pid) == component and procs.alive(pid))

    def says(self, pattern: str) -> bool:
        return re.search(pattern, self.output(), re.MULTILINE) is not None

    def end(self, sig: signal.Signals = signal.SIGINT) -> int:
        """Stop it with `sig` (unless it ended) and make sure that nothing of it is left."""
        tree = descendants(self.process.pid)
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(120)
            except subprocess.TimeoutExpired:
                self.process.kill()
        for pid in tree:
            if procs.alive(pid):
                os.kill(pid, signal.SIGKILL)
        return self.process.wait()


def run(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "launcher.cli", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def start_up(root: Path, models_dir: Path, services: tuple[str, ...], edge_workers: int) -> Command:
    """`tritongate up` on free ports, its Triton serving the models of `services` only."""
    repository = root / "repository"
    repository.mkdir()
    for name in services:
        (repository / MODELS[name][0].name).symlink_to(MODELS[name][0])
    full = json.loads((TESTS / "model_config.json").read_text())
    triton = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    config: dict[str, Any] = {"model_infos": [info for info in full["model_infos"] if info["name"] == CHAT]}
    for name in services:
        model, section = MODELS[name][0].name, MODELS[name][1]
        config[section] = [dict(entry, url=f"127.0.0.1:{triton['grpc']}") for entry in full[section]
                           if entry["name"] == model]
    (root / "model_config.json").write_text(json.dumps(config))
    ports = {name: free_port() for name in ("edge", *services)}
    env = dict(os.environ, TRITONGATE_MODELS_DIR=str(models_dir),
               TRITONGATE_TRITON_MODEL_REPOSITORY=json.dumps([str(repository)]),
               **{f"TRITONGATE_TRITON_{kind.upper()}_PORT": str(port) for kind, port in triton.items()},
               **{f"TRITONGATE_{name.upper()}_PORT": str(port) for name, port in ports.items()})
    args = ["up", "--no-fetch", "--workers", "1", "--edge-workers", str(edge_workers),
            "--config-file", str(root / "model_config.json")]
    up = Command(run(args, env, root / "up.log"), root / "up.log", ports["edge"],
                 {**ports, **{f"triton_{kind}": port for kind, port in triton.items()}})
    wait_until(lambda: up.says(r"ready: OpenAI API") and http_ok(f"{up.url}/health"), START_S, "tritongate up",
               up.process)
    return up


def service_load(url: str) -> Load:
    """Each service's model in a loop; a request that gets no HTTP answer (a killed edge worker held its
    connection) is sent once more, on a new connection."""
    return Load(url, REQUESTS, retry_transport=True)


def unexpected(outcomes: list[Outcome], outages: dict[str, tuple[float, float]]) -> list[Outcome]:
    """The failures that no outage explains: anything but 200, except a 503 `service_unavailable` for a
    request to a service that was down (sent before it was answering again, answered after it was killed).
    "Answering again" is the first answer through either edge worker: the other's channel may still wait
    out its reconnect backoff."""
    def explained(o: Outcome) -> bool:
        killed, back = outages.get(o.name, (float("inf"), 0.0))
        return o.status == 503 and o.code == "service_unavailable" and o.ended >= killed and \
            o.started <= back + MAX_RECONNECT_BACKOFF_MS / 1000

    return [o for o in outcomes if o.status != 200 and not explained(o)]


@pytest.fixture(scope="module")
def up(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Command]:
    command = start_up(tmp_path_factory.mktemp("up"), models_dir, ("llm", "embed", "rerank"), edge_workers=2)
    try:
        yield command
    finally:
        command.end()


def kill_service(up: Command, load: Load, service: str) -> tuple[float, float]:
    """SIGKILL `service` and wait until its model answers again: when it was killed and when it was back."""
    [pid] = up.pids(service)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: up.says(rf"{service} was killed by SIGKILL after [\d.]+ s; restart 1 in"), 30,
               f"the log to say that {service} restarts")
    wait_until(lambda: grpc_serving(f"127.0.0.1:{up.ports[service]}"), BACK_S, f"{service} again")
    assert up.pids(service) not in ([], [pid])
    wait_until(lambda: load.first_ok(service, killed) is not None, BACK_S, f"{service}'s model again")
    return killed, load.first_ok(service, killed) or 0.0


def test_killed_services_and_an_edge_worker_come_back_while_the_others_serve(up: Command) -> None:
    outages: dict[str, tuple[float, float]] = {}
    with service_load(up.url) as load:
        wait_until(lambda: load.ok_since(0) == set(REQUESTS), 60, "every model to answer")
        for service in ("embed", "llm", "rerank"):
            outages[service] = kill_service(up, load, service)

        workers = up.pids("edge")
        assert len(workers) == 2
        killed = time.monotonic()
        os.kill(workers[0], signal.SIGKILL)
        wait_until(lambda: up.says(r"edge-\d was killed by SIGKILL after [\d.]+ s; restart 1 in"), 30,
                   "the log to say that an edge worker restarts")
        wait_until(lambda: len(fresh := set(up.pids("edge")) - set(workers)) == 1
                   and listens(fresh.pop(), up.edge_port), BACK_S, "a new edge worker on the port")
        back = time.monotonic()
        wait_until(lambda: load.ok_since(back) == set(REQUESTS), BACK_S, "every model after the edge worker's restart")
    assert not unexpected(load.outcomes, outages), unexpected(load.outcomes, outages)[:5]
    assert {o.name for o in load.outcomes if o.started > killed} == set(REQUESTS)
    # The killed worker's requests in progress left the metrics with it (they are marked dead).
    metrics = httpx.get(f"{up.url}/metrics", timeout=10).text
    in_progress = re.findall(r'^http_requests_in_progress\{method="POST"\} (\S+)$', metrics, re.MULTILINE)
    assert [float(value) for value in in_progress] in ([], [0.0]), in_progress


def test_sigint_while_a_restart_waits_stops_everything(up: Command) -> None:
    tree = descendants(up.process.pid)
    assert {role(pid) for pid in tree} >= {"triton", "llm", "embed", "rerank", "edge"}
    shared = metrics_dir(up.pids("edge")[0])
    assert shared.is_dir()
    restarts = len(re.findall(r"^.*rerank was killed", up.output(), re.MULTILINE))
    os.kill(up.pids("rerank")[0], signal.SIGKILL)
    wait_until(lambda: len(re.findall(r"rerank was killed", up.output())) > restarts, 30,
               "the log to say that rerank restarts")
    tree |= descendants(up.process.pid)
    up.process.send_signal(signal.SIGINT)  # its restart waits at least a second
    assert up.process.wait(120) == 0
    assert "[tritongate] stopping" in up.output()
    assert [pid for pid in tree if procs.alive(pid)] == []
    assert not shared.exists()


def test_triton_killed_comes_back_then_a_service_that_cannot_start_stops_the_stack(
        models_dir: Path, tmp_path: Path) -> None:
    small = start_up(tmp_path, models_dir, ("llm",), edge_workers=1)
    try:
        [triton] = small.pids("triton")
        group = procs.group(triton)
        regions = python_backend_shm(group)
        os.kill(triton, signal.SIGKILL)
        wait_until(lambda: small.says(r"triton was killed by SIGKILL after [\d.]+ s; restart 1 in"), 30,
                   "the log to say that Triton restarts")
        wait_until(lambda: http_ok(f"http://127.0.0.1:{small.ports['triton_http']}/v2/health/ready"), START_S,
                   "Triton on the same port")
        assert small.pids("triton") not in ([], [triton])
        assert [pid for pid in group if procs.alive(pid)] == [] and regions and not any(r.exists() for r in regions)
        path, body = REQUESTS["llm"]
        wait_until(lambda: httpx.post(f"{small.url}{path}", json=body, timeout=30).status_code == 200, BACK_S,
                   "chat after Triton's restart")

        config = tmp_path / "model_config.json"
        config.write_text(json.dumps({"llm": [{"name": CHAT}]}))  # no url: the service refuses it at start-up
        tree = descendants(small.process.pid)
        os.kill(small.pids("llm")[0], signal.SIGKILL)
        small.process.wait(BACK_S)
        output = small.output()
        assert small.process.returncode != 0
        assert re.search(r"^tritongate up: error: llm cannot start: it stopped within 10 s of starting 3 times in "
                         r"a row; the last time it exited with code 1$", output, re.MULTILINE), output[-3000:]
        assert re.search(r"llm exited with code 1 after [\d.]+ s; restart \d in [24] s", output)
        assert "tritongate llm: error:" in output  # the service's own reason, above
        assert [pid for pid in tree if procs.alive(pid)] == []
    finally:
        small.end()


def test_edge_workers_restart_a_killed_worker_and_stop_when_none_can_start(tmp_path: Path) -> None:
    unused = {f"--{name}=127.0.0.1:{free_port()}" for name in ("llm", "embed", "rerank")}  # no service needed
    port = free_port()
    edge = Command(run(["edge", "--workers", "2", "--port", str(port), *unused], dict(os.environ),
                       tmp_path / "edge.log"), tmp_path / "edge.log", port)
    try:
        wait_until(lambda: len(edge.pids("edge")) == 2 and all(listens(pid, port) for pid in edge.pids("edge")),
                   120, "two edge workers", edge.process)
        workers = edge.pids("edge")
        shared = metrics_dir(workers[0])
        os.kill(workers[1], signal.SIGKILL)
        wait_until(lambda: edge.says(r"edge-\d was killed by SIGKILL after [\d.]+ s; restart 1 in"), 30,
                   "the log to say that a worker restarts", edge.process)
        wait_until(lambda: len(fresh := set(edge.pids("edge")) - set(workers)) == 1 and listens(fresh.pop(), port),
                   120, "a new worker on the port", edge.process)
        assert http_ok(f"{edge.url}/health/live")
        tree = descendants(edge.process.pid)
        assert edge.end(signal.SIGTERM) == 0
        assert [pid for pid in tree if procs.alive(pid)] == [] and not shared.exists()
    finally:
        edge.end()

    with socket.socket() as taken:  # a listener without SO_REUSEPORT: the workers cannot bind beside it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        failing = Command(run(["edge", "--workers", "2", "--port", str(port), *unused], dict(os.environ),
                              tmp_path / "failing.log"), tmp_path / "failing.log", port)
        try:
            assert failing.process.wait(120) == 1
            output = failing.output()
            assert re.search(r"^tritongate edge: error: edge-\d cannot start: it stopped within 10 s of starting 3 "
                             r"times in a row; the last time it exited with code 1$", output, re.MULTILINE), output
            # Each worker's own reason, in one line.
            assert f"tritongate edge: error: cannot listen on 127.0.0.1:{port}: Address already in use" in output
            assert "Traceback" not in output
        finally:
            failing.end()
