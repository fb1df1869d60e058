"""Client-side load balancing, failover, scale-up and draining on loopback, against the session's real
Triton: embed replicas are separate processes on their own loopback addresses (127.0.0.2, .3, ... on
one port, like containers), the edge reaches them through a multi-address target or through DNS
(a small DNS server on loopback that the test edits, as compose's or Kubernetes' DNS changes when
replicas come and go). Each replica's own Prometheus counters say how much it served."""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from launcher.stack import grpc_serving
from services.common.server import LIVENESS
from tests.support.ports import free_port, wait_until
from tests.support.stack import spawn as _spawn
from tritongate.triton_local import TritonProcess

MODEL = "all-minilm-l6-v2"
CONNECTION_AGE_MS = 3000  # short, so that clients re-resolve and find new replicas within seconds
SHUTDOWN_GRACE_S = 20


def port_free_on(hosts: list[str]) -> int:
    """A port nothing listens on at any of `hosts` (TCP)."""
    for _ in range(50):
        port = free_port()
        try:
            for host in hosts:
                with socket.socket() as sock:
                    sock.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no common free port")


class LoopbackDns:
    """Answers A queries for every name with the current `addresses` (TTL 0), AAAA and others with none."""

    def __init__(self) -> None:
        self.addresses: list[str] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        try:
            while True:
                self._answer(*self.sock.recvfrom(512))
        except OSError:  # closed
            return

    def _answer(self, query: bytes, peer: tuple[str, int]) -> None:
        end = 12
        while query[end]:
            end += query[end] + 1
        qtype = struct.unpack(">H", query[end + 1:end + 3])[0]
        question = query[12:end + 5]
        records = list(self.addresses) if qtype == 1 else []  # 1: A
        answers = b"".join(struct.pack(">HHHIH", 0xC00C, 1, 1, 0, 4) + socket.inet_aton(a) for a in records)
        header = struct.pack(">HHHHHH", struct.unpack(">H", query[:2])[0], 0x8180, 1, len(records), 0, 0)
        self.sock.sendto(header + question + answers, peer)

    def close(self) -> None:
        self.sock.close()


@dataclass
class Replica:
    """One embed service process with its metrics endpoint."""

    host: str
    port: int
    metrics_port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def samples(self, metric: str, methods: tuple[str, ...] = ("Embed", "EmbedBatch")
                ) -> list[tuple[dict[str, str], float]]:
        text = httpx.get(f"http://{self.host}:{self.metrics_port}/metrics", timeout=2).text
        return [(s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
                if s.name == metric and s.labels.get("grpc_method") in methods]

    def served(self) -> int:
        """Embed requests this replica completed with OK: each counts as an Embed call, whether it came in an
        Embed RPC or with others in an EmbedBatch RPC (the edge sends those under load)."""
        return int(sum(v for labels, v in self.samples("grpc_server_handled_total", ("Embed",))
                       if labels["grpc_code"] == "OK"))

    def in_flight(self) -> int:
        return int(sum(v for _, v in self.samples("grpc_server_in_flight")))


@dataclass
class Cluster:
    triton: TritonProcess
    config_file: Path
    logs: Path
    port: int
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return dict(os.environ, TRITONGATE_CONFIG_FILE=str(self.config_file), LOG_LEVEL="INFO",
                    TRITONGATE_MAX_CONNECTION_AGE_MS=str(CONNECTION_AGE_MS),
                    TRITONGATE_SHUTDOWN_GRACE_S=str(SHUTDOWN_GRACE_S))

    def replica(self, host: str) -> Replica:
        metrics_port = port_free_on([host])
        log = self.logs / f"embed-{host}-{len(self.processes)}.log"
        process = _spawn(["embed", "--host", host, "--port", str(self.port), "--metrics-port", str(metrics_port)],
                         self.env(), log)
        self.processes.append(process)
        return Replica(host, self.port, metrics_port, process, log)

    def edge(self, embed_target: str) -> tuple[str, subprocess.Popen[bytes]]:
        port = free_port()
        unused = f"127.0.0.1:{free_port()}"  # no llm or rerank service in these tests
        process = _spawn(["edge", "--port", str(port), f"--embed={embed_target}", f"--llm={unused}",
                          f"--rerank={unused}"], self.env(), self.logs / f"edge-{port}.log")
        self.processes.append(process)
        return f"http://127.0.0.1:{port}", process

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()


def wait_serving(*replicas: Replica) -> None:
    for r in replicas:
        wait_until(lambda r=r: grpc_serving(r.address), 120, f"embed replica {r.address}", r.process)


def wait_edge(url: str, process: subprocess.Popen[bytes]) -> None:
    def up() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 60, "edge", process)


def embed(client: httpx.Client, inputs: int = 1) -> httpx.Response:
    texts = [f"sentence {i} about load balancing across replicas" for i in range(inputs)]
    return client.post("/v1/embeddings", json={"model": MODEL, "input": texts if inputs > 1 else texts[0]})


class Load:
    """Continuous load through the edge from a few threads, bounded in count and time; records failures."""

    def __init__(self, url: str, threads: int = 4, inputs: int = 1, max_requests: int = 5000,
                 max_seconds: float = 60) -> None:
        self.url, self.threads, self.inputs = url, threads, inputs
        self.max_requests, self.deadline = max_requests, time.monotonic() + max_seconds
        self.sent = self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(threads)

    def _worker(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                with self._lock:
                    if self.sent >= self.max_requests:
                        return
                    self.sent += 1
                try:
                    response = embed(client, self.inputs)
                    failure = None if response.status_code == 200 else f"{response.status_code} {response.text}"
                except httpx.HTTPError as exc:
                    failure = repr(exc)
                with self._lock:
                    if failure:
                        self.failures.append(failure)
                    else:
                        self.ok += 1

    def __enter__(self) -> Load:
        self._futures = [self._pool.submit(self._worker) for _ in range(self.threads)]
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for future in self._futures:
            future.result()
        self._pool.shutdown()


def until(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll `check` every 50 ms; return the seconds it took."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what} not seen after {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - start


def drain_report(log: Path) -> tuple[int, dict[str, int]]:
    """What a stopped service logged: RPCs in flight at SIGTERM, and how those finishing after it ended."""
    text = log.read_text()
    in_flight = re.search(r"shutting down: draining (\d+) RPCs in flight", text)
    finished = re.search(r"stopped: RPCs finished while draining: (.*)", text)
    assert in_flight and finished, text[-2000:]
    counts = dict(re.findall(r"'(\w+)': (\d+)", finished.group(1)))
    return int(in_flight.group(1)), {code: int(n) for code, n in counts.items()}


@pytest.fixture(scope="module")
def cluster(triton: TritonProcess, model_config_file: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
    cluster = Cluster(triton, model_config_file, tmp_path_factory.mktemp("scaling"), port_free_on(hosts))
    try:
        yield cluster
    finally:
        cluster.stop()


@dataclass
class Pair:
    a: Replica
    b: Replica
    url: str
    edge: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def two_replicas(cluster: Cluster) -> Pair:
    """Replicas on 127.0.0.2 and 127.0.0.3 (same port) behind an edge with a two-address target."""
    a, b = cluster.replica("127.0.0.2"), cluster.replica("127.0.0.3")
    url, edge = cluster.edge(f"ipv4:{a.address},{b.address}")
    wait_serving(a, b)
    wait_edge(url, edge)
    return Pair(a, b, url, edge)


def tritongate_health(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = subprocess.run([sys.executable, "-m", "launcher.cli", "health", *args], capture_output=True,
                            text=True, env=env, timeout=30)
    return result.returncode, result.stdout.strip()


def test_health_probes_of_compose_and_kubernetes(two_replicas: Pair) -> None:
    a, url = two_replicas.a, two_replicas.url
    # `tritongate health embed` as the compose health check runs it: the configured host and port.
    env = dict(os.environ, TRITONGATE_SERVICE_HOST=a.host, TRITONGATE_EMBED_PORT=str(a.port))
    assert tritongate_health("embed", env=env) == (0, f"{a.address}: SERVING")
    assert tritongate_health(f"{url}/health")[0] == 0
    down = f"127.0.0.1:{free_port()}"
    assert tritongate_health(down, "--timeout", "0.5") == (1, f"{down}: unreachable: UNAVAILABLE")
    assert tritongate_health(f"http://127.0.0.1:{free_port()}/health", "--timeout", "0.5")[0] == 1
    # Kubernetes' liveness probe asks for the `liveness` health service; readiness for "".
    with grpc.insecure_channel(a.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in (LIVENESS, "", "tritongate.embed.v1.EmbedService"):
            status = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING, name


def test_round_robin_spreads_requests_over_both_replicas(two_replicas: Pair) -> None:
    a, b, url = two_replicas.a, two_replicas.b, two_replicas.url
    before = a.served(), b.served()
    with ThreadPoolExecutor(4) as pool, httpx.Client(base_url=url, timeout=30) as client:
        statuses = list(pool.map(lambda _: embed(client).status_code, range(400)))
    assert statuses == [200] * 400
    served = a.served() - before[0], b.served() - before[1]
    print(f"\nreplica split of 400 requests: {a.host} {served[0] / 4:.1f}%, {b.host} {served[1] / 4:.1f}%")
    assert sum(served) == 400  # each request was served once: no retries, nothing lost
    assert all(140 <= n <= 260 for n in served), served
    # The image has no torch: neither the services nor the edge load it, even where it is installed.
    for pid in (a.process.pid, b.process.pid, two_replicas.edge.pid):
        assert "libtorch" not in Path(f"/proc/{pid}/maps").read_text()


def test_failover_sigkill_then_sigterm_with_a_third_replica(cluster: Cluster, two_replicas: Pair) -> None:
    a, b, url = two_replicas.a, two_replicas.b, two_replicas.url
    # SIGKILL one of two replicas under load: its requests in flight are retried on the other.
    with Load(url, max_requests=3000, max_seconds=20) as load:
        until(lambda: load.ok >= 100, 15, "load before the kill")
        a.process.kill()
        served_by_b = b.served()
        until(lambda: b.served() >= served_by_b + 150, 15, "traffic after the kill")
    killed_phase = load.sent
    print(f"\nSIGKILL {a.host}: {load.sent} requests, {len(load.failures)} failed")
    assert load.failures == [], load.failures[:5]

    # A third replica replaces the killed one at its address; then SIGTERM the other under load.
    c = cluster.replica(a.host)
    wait_serving(c)
    with Load(url, inputs=16, max_requests=3000, max_seconds=40) as load:
        found = until(lambda: c.served() > 0, 20, "traffic on the third replica")
        until(lambda: b.in_flight() >= 1, 10, "a request in flight on the replica to stop")
        b.process.send_signal(signal.SIGTERM)
        served_by_c = c.served()
        until(lambda: c.served() >= served_by_c + 50, 15, "traffic after SIGTERM")
        assert b.process.wait(SHUTDOWN_GRACE_S + 5) == 0
    in_flight, finished = drain_report(b.log)
    print(f"third replica got traffic {found:.1f} s after SERVING; SIGTERM {b.host} with {in_flight} in flight: "
          f"{load.sent} requests, {len(load.failures)} failed; finished while draining: {finished}")
    assert load.failures == [], load.failures[:5]
    # Draining finished every RPC in flight at SIGTERM, and at least one: the request seen in flight may end
    # before the service handles the signal, and then one that arrived meanwhile is what drains.
    assert set(finished) == {"OK"} and finished["OK"] >= max(in_flight, 1)
    assert killed_phase > 0 and load.ok > 50


@pytest.fixture(scope="module")
def dns() -> Iterator[LoopbackDns]:
    server = LoopbackDns()
    yield server
    server.close()


def test_scale_up_new_replica_gets_traffic_within_the_connection_age(cluster: Cluster, dns: LoopbackDns) -> None:
    first = cluster.replica("127.0.0.4")
    dns.addresses = [first.host]
    url, edge = cluster.edge(f"dns://127.0.0.1:{dns.port}/embed.tritongate.test:{cluster.port}")
    wait_serving(first)
    wait_edge(url, edge)
    with Load(url, threads=2, max_requests=20000, max_seconds=60) as load:
        until(lambda: load.ok >= 50, 15, "load on the first replica")
        second = cluster.replica("127.0.0.5")
        wait_serving(second)
        dns.addresses = [first.host, second.host]  # the new replica's address appears in DNS
        found = until(lambda: second.served() > 0, 5 * CONNECTION_AGE_MS / 1000 + 10, "traffic on the new replica")
        served = second.served()
        until(lambda: second.served() >= served + 50, 15, "a share of the load on the new replica")
    print(f"\nnew replica got traffic {found:.1f} s after it was SERVING and in DNS "
          f"(max connection age {CONNECTION_AGE_MS / 1000:.0f} s); {load.sent} requests, {len(load.failures)} failed")
    assert load.failures == [], load.failures[:5]
    assert found <= 3 * CONNECTION_AGE_MS / 1000 + 5


def test_edge_drains_requests_in_flight_on_sigterm(cluster: Cluster, dns: LoopbackDns) -> None:
    url, edge = cluster.edge(f"dns://127.0.0.1:{dns.port}/embed.tritongate.test:{cluster.port}")
    wait_edge(url, edge)
    with ThreadPoolExecutor(3) as pool, httpx.Client(base_url=url, timeout=60) as client:
        futures = [pool.submit(embed, client, 512) for _ in range(3)]  # each takes a while on this CPU

        def in_progress() -> float:
            text = httpx.get(f"{url}/metrics", timeout=2).text
            return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                       if s.name == "http_requests_in_progress" and s.labels["method"] == "POST")

        until(lambda: in_progress() >= 3, 10, "three requests in flight at the edge")
        edge.send_signal(signal.SIGTERM)
        responses = [future.result() for future in futures]
    assert [r.status_code for r in responses] == [200] * 3
    assert all(len(r.json()["data"]) == 512 for r in responses)
    assert edge.wait(SHUTDOWN_GRACE_S + 5) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=2)
