"""Shared benchmark plumbing: a private stack on free ports, closed-loop load, latency statistics, the
CPU each of the stack's processes spends per request (from /proc, so the same command reads right on a
laptop and on a GPU server), and what the model cost Triton on each path (its CPU, its batches).

Every benchmark takes `--edge-workers N` and `--replicas N` (service replicas), as `tritongate up
--edge-workers N --<service>-replicas N` would run them; `--workers N` sets both, `auto` as `up` does.

For a bigger machine (a GPU server), the demo models' Triton configuration can be changed for a run:
`--device`, `--triton-instances`, `--max-batch` and `--max-active` (see `TRITON`) make the private
stack load patched copies of the demo models' folders from a temporary repository, never editing
deploy/. Benchmarks whose load can be spread take `--load-processes N`: N load processes share each
point's concurrency, so that one Python client is not what limits the rate (bench/load.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from bench.load import LOAD, Load, LoadProcesses, load_processes
from launcher.stack import LocalStack
from launcher.workers import parse_workers
from tritongate import procs
from tritongate.settings import DEPLOY_DIR, Settings, default_cache_dir, default_models_dir
from tritongate.triton_local import TritonLaunch, TritonProcess, start_triton

# The benchmarks' own Triton models (embed-echo and its variants), beside deploy/triton's.
BENCH_MODELS = Path(__file__).resolve().parent / "triton_models"

# Processes per component of the benchmarks' stacks (bench_main sets them from the command line).
PROCESSES = {"edge": 1, "services": 1}
# Changes to the demo models' Triton configuration (bench_main sets them; none: deploy/triton as it is).
# They apply to the models with a `device` parameter (the demo models): `device` that parameter,
# `instances` their instance_group counts, `max_batch` the max_batch_size of those with dynamic batching,
# `max_active` the LLMs' max_active_requests.
TRITON: dict[str, Any] = {}
_STACKS: list[LocalStack] = []  # the running private stack, for the CPU accounting of `compare`


def start_script(source: str, port: int, **popen: Any) -> subprocess.Popen[bytes]:
    """`source` run by this Python in a process of its own, with `port` as its argument."""
    return subprocess.Popen([sys.executable, "-c", source, str(port)], **popen)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def private_stack(sections: dict[str, list[dict[str, Any]]], triton_models: list[str],
                  extra_repositories: tuple[Path, ...] = ()) -> Iterator[LocalStack]:
    """Triton with only `triton_models` (from deploy/triton and `extra_repositories`), the services for
    `sections` (entries of the model configuration) and the edge, all on free ports."""
    with tempfile.TemporaryDirectory(prefix="tritongate-bench-") as tmp:
        root = Path(tmp)
        repo = root / "repository"
        repo.mkdir()
        for name in triton_models:
            source = next(r / name for r in (DEPLOY_DIR / "triton", *extra_repositories) if (r / name).is_dir())
            if TRITON and is_demo_model(source):
                shutil.copytree(source, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
                patch_config(repo / name / "config.pbtxt", **TRITON)
            else:
                (repo / name).symlink_to(source)
        grpc_port = free_port()
        config = {section: [dict(e, url=f"127.0.0.1:{grpc_port}") for e in entries]
                  for section, entries in sections.items()}
        (root / "model_config.json").write_text(json.dumps(config))
        settings = Settings(
            config_file=root / "model_config.json", triton_model_repository=[repo],
            triton_http_port=free_port(), triton_grpc_port=grpc_port, triton_metrics_port=free_port(),
            edge_port=free_port(), llm_port=free_port(), embed_port=free_port(), rerank_port=free_port(),
            uvicorn_log_level="warning",
        )
        processes = {"edge": PROCESSES["edge"], **{name: PROCESSES["services"] for name in sections_services(sections)}}
        with LocalStack(settings, log_dir=root / "logs", processes=processes) as stack:
            _STACKS.append(stack)
            try:
                yield stack
            finally:
                _STACKS.remove(stack)


@contextmanager
def triton_processes(root: Path, repositories: Mapping[str, Mapping[str, Path]]) -> Iterator[dict[str, TritonProcess]]:
    """One Triton per entry of `repositories` (its name → {served model name → model folder}), each on its
    own free ports with a repository of symlinks under `root`, all ready; stopped on the way out."""
    tritons: dict[str, TritonProcess] = {}
    try:
        for name, models in repositories.items():
            repository = root / f"repository-{name}"
            repository.mkdir()
            for model, folder in models.items():
                (repository / model).symlink_to(folder)
            tritons[name] = start_triton(TritonLaunch(
                repositories=[repository], models_dir=default_models_dir(), cache_dir=default_cache_dir(),
                http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                log_path=root / f"tritonserver-{name}.log"))
        for triton in tritons.values():
            triton.wait_ready(300)
        yield tritons
    finally:
        for triton in tritons.values():
            triton.stop()


def triton_answered(triton: TritonProcess, model: str) -> int:
    """Requests `triton` has answered successfully for `model` (its statistics)."""
    url = f"http://127.0.0.1:{triton.http_port}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=5) as response:
        stats = json.load(response)["model_stats"]
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)


def _config(path: Path) -> Any:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def is_demo_model(folder: Path) -> bool:
    return "device" in _config(folder / "config.pbtxt").parameters


def patch_config(path: Path, device: str | None = None, instances: int | None = None, max_batch: int | None = None,
                 max_active: int | None = None) -> None:
    """Rewrite a copy of a demo model's config.pbtxt with the benchmark's changes (comments are lost)."""
    config = _config(path)
    if device:
        config.parameters["device"].string_value = device
    if instances:
        for group in config.instance_group:
            group.count = instances
    if max_batch and config.HasField("dynamic_batching"):
        config.max_batch_size = max_batch
    if max_active and "max_active_requests" in config.parameters:
        config.parameters["max_active_requests"].string_value = str(max_active)
    path.write_text(text_format.MessageToString(config))


def sections_services(sections: dict[str, list[dict[str, Any]]]) -> list[str]:
    from tritongate.registry import SERVICES

    return [service.name for service in SERVICES if sections.get(service.section)]


def process_cpu(pid: int) -> float:
    """User + system seconds of a process, all its threads."""
    fields = procs.stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU of the running stack's edge and service processes (Triton's excluded) over a measurement:
    `start()`, then `per(count)` gives microseconds per request (or token) for each process and summed
    per component (`edge`, the service) and in all (`gateway`)."""

    def __init__(self) -> None:
        self.pids = {label: process.pid for label, process in _STACKS[-1].children} if _STACKS else {}
        self.before: dict[str, float] = {}

    def start(self) -> None:
        self.before = {label: process_cpu(pid) for label, pid in self.pids.items()}

    def per(self, count: int) -> dict[str, float]:
        if not self.pids or not count:
            return {}
        spent = {label: process_cpu(pid) - self.before[label] for label, pid in self.pids.items()}
        result = {label: round(seconds / count * 1e6, 1) for label, seconds in spent.items()}
        for component in dict.fromkeys(label.split("-")[0] for label in spent):
            total = sum(seconds for label, seconds in spent.items() if label.split("-")[0] == component)
            result[f"{component}_total"] = round(total / count * 1e6, 1)
        result["gateway"] = round(sum(spent.values()) / count * 1e6, 1)
        return result


def process_tree(pid: int) -> list[int]:
    """`pid` and its child processes (Triton and its Python-backend stubs, which run the models)."""
    return [pid, *procs.children(pid)]


class ModelMeter:
    """What serving `model` cost Triton over a measurement, the same on both paths: the CPU of Triton's
    processes (the server and the stubs that run Python-backend models; a GPU model's kernels do not
    show) per request, and the rows Triton's batches held per model execution. Through the gateway the
    model may be fed differently than straight (other batches, other timing); this shows how."""

    def __init__(self, model: str) -> None:
        stack = _STACKS[-1] if _STACKS else None
        self.model = model
        self.http_port = stack.triton.http_port if stack and stack.triton else None
        self.pids = process_tree(stack.triton.process.pid) if stack and stack.triton else []
        self.before: tuple[float, int, int] = (0.0, 0, 0)

    def _reading(self) -> tuple[float, int, int]:
        """(CPU seconds, rows inferred, executions) so far."""
        url = f"http://127.0.0.1:{self.http_port}/v2/models/{self.model}/stats"
        with urllib.request.urlopen(url, timeout=5) as response:
            stats = json.load(response)["model_stats"]
        cpu = 0.0
        for pid in self.pids:
            with contextlib.suppress(OSError):
                cpu += process_cpu(pid)
        return (cpu, sum(int(s.get("inference_count", 0)) for s in stats),
                sum(int(s.get("execution_count", 0)) for s in stats))

    def start(self) -> None:
        if self.http_port:
            self.before = self._reading()

    def per(self, requests: int) -> dict[str, float]:
        if not self.http_port or not requests:
            return {}
        cpu, rows, executions = (now - then for now, then in zip(self._reading(), self.before, strict=True))
        return {"triton_cpu_us_per_request": round(cpu / requests * 1e6, 1),
                "rows_per_execution": round(rows / executions, 2) if executions else 0.0}


def percentile_ms(ordered: list[float], q: float) -> float:
    """The `q` quantile of sorted durations in seconds (the value at rank n·q), in milliseconds."""
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 2)


def summarize(latencies: list[float], elapsed: float, items_per_request: int) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "requests": len(ordered),
        "requests_per_s": round(len(ordered) / elapsed, 1),
        "items_per_s": round(len(ordered) * items_per_request / elapsed, 1),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": percentile_ms(ordered, 0.99),
    }


async def closed_loop(call: Callable[[int], Awaitable[None]], concurrency: int, seconds: float,
                      warmup: int = 10, started: Callable[[], None] = lambda: None) -> tuple[list[float], float]:
    """`concurrency` workers each send one request after another for `seconds` (after `warmup` requests,
    then `started()`); returns latencies."""
    for i in range(warmup):
        await call(i)
    started()
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    counter = iter(range(10**9))

    async def worker() -> None:
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            await call(next(counter))
            latencies.append(time.perf_counter() - sent)

    begun = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - begun


def ratio(edge: float, direct: float) -> float:
    return round(edge / direct, 3) if direct else 0.0


Path_ = Callable[[list[str]], Awaitable[None]]


@dataclass(frozen=True)
class Requests:
    """What a point sends: request i carries `size` inputs, item(i * size), item(i * size + 1), ..."""

    size: int
    item: Callable[[int], str]  # module-level, so that a load process can be given it

    def inputs(self, i: int) -> list[str]:
        return [self.item(i * self.size + k) for k in range(self.size)]


async def compare(requests: Requests, concurrency: int, paths: Mapping[str, Path_], seconds: float, *,
                  warmup: int = 10, model: str = "", load: Load | None = None) -> dict[str, Any]:
    """One point: the same closed-loop load straight to Triton (`paths["direct_triton"]`), then through the
    edge (`paths["edge"]`), and the ratios. With `model` (its Triton name), each path also reports what
    the model cost Triton (ModelMeter). With `load` and load processes, they send the load (`load.task`
    returns closed_loop's result) instead of this process."""
    size = requests.size
    row: dict[str, Any] = {"items_per_request": size, "concurrency": concurrency}
    meter = CpuMeter()
    for name in ("direct_triton", "edge"):
        async def call(i: int, path: Path_ = paths[name]) -> None:
            await path(requests.inputs(i))

        model_meter = ModelMeter(model) if model else None

        def started(model_meter: ModelMeter | None = model_meter) -> None:
            meter.start()
            if model_meter:
                model_meter.start()

        processes = load_processes() if load else None
        if processes and load:
            shares = await processes.run(load, name, concurrency, seconds, started)
            latencies, elapsed = [t for share, _ in shares for t in share], max(e for _, e in shares)
        else:
            latencies, elapsed = await closed_loop(call, concurrency, seconds, warmup, started)
        row[name] = summarize(latencies, elapsed, size)
        if model_meter:
            row[name].update(model_meter.per(len(latencies)))
    row["throughput_ratio"] = ratio(row["edge"]["items_per_s"], row["direct_triton"]["items_per_s"])
    row["cpu_us_per_request"] = meter.per(row["edge"]["requests"])
    if size > 1:  # per sentence or document
        row["cpu_us_per_item"] = meter.per(row["edge"]["requests"] * size)
    row["added_p50_ms"] = round(row["edge"]["p50_ms"] - row["direct_triton"]["p50_ms"], 2)
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def bench_main(doc: str | None, run: Callable[..., Coroutine[Any, Any, dict[str, Any]]],
               arguments: Callable[[argparse.ArgumentParser], None] | None = None, load: bool = False) -> None:
    """The benchmarks' command line: `--seconds`, the stack's processes, the demo models' Triton
    configuration, JSON on stdout, progress on stderr. `arguments` adds a benchmark's own options, which
    `run(seconds, **options)` receives; `load`: the benchmark takes `--load-processes`."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per point and path")
    parser.add_argument("--workers", type=parse_workers, default=1, metavar="N|auto",
                        help="edge workers and service replicas (default 1)")
    parser.add_argument("--edge-workers", type=parse_workers, metavar="N|auto", help="edge workers")
    parser.add_argument("--replicas", type=parse_workers, metavar="N|auto", help="replicas of the service")
    triton = parser.add_argument_group("the demo models' Triton configuration (default: deploy/'s)")
    triton.add_argument("--device", metavar="auto|cpu|cuda|cuda:N", help="their `device` parameter")
    triton.add_argument("--triton-instances", type=_positive, metavar="N", help="their instance_group counts")
    triton.add_argument("--max-batch", type=_positive, metavar="N",
                        help="max_batch_size of the dynamically batched ones (the MiniLM models)")
    triton.add_argument("--max-active", type=_positive, metavar="N", help="the LLMs' max_active_requests")
    if load:
        parser.add_argument("--load-processes", type=int, default=0, metavar="N",
                            help="load processes sharing each point's concurrency (default 0: the benchmark's own)")
    common = {action.dest for action in parser._actions}
    if arguments:
        arguments(parser)
    args = parser.parse_args()
    PROCESSES.update(edge=args.edge_workers or args.workers, services=args.replicas or args.workers)
    TRITON.update({key: value for key, value in (("device", args.device), ("instances", args.triton_instances),
                                                 ("max_batch", args.max_batch), ("max_active", args.max_active))
                   if value})
    if getattr(args, "load_processes", 0) > 0:
        LOAD["processes"] = LoadProcesses(args.load_processes)
    options = {key: value for key, value in vars(args).items() if key not in common}
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: the stack it started stops too
    try:
        result = asyncio.run(run(args.seconds, **options))
    finally:
        if "processes" in LOAD:
            LOAD.pop("processes").close()
    print(json.dumps({**result, "processes": dict(PROCESSES), "cores": os.cpu_count(), "triton": dict(TRITON),
                      "load_processes": getattr(args, "load_processes", 0)}, indent=2))
