"""`tritongate up`: the whole stack on one machine: local Triton, the services, the edge.

Each component runs as its own process (`python -m launcher.cli <component>`), exactly as in a
deployment. `LocalStack` starts them in order and stops them in reverse; the tests and benchmarks use it
too, on free ports. It starts one process for each service of tritongate/registry.py whose section of the
model configuration has entries.

Its processes are supervised (launcher/supervisor.py) but restarted only on request: `run_stack` (that is,
`tritongate up`) heals the stack until it is stopped, so a process that dies comes back while the others
serve; a stack that the tests start leaves a killed process dead unless the test heals it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from launcher.healthcheck import probe
from launcher.supervisor import Process, Supervisor
from launcher.workers import METRICS_DIR_ENV, REPLICA_PORT_STEP, forget_worker_metrics, replica_ports, replicas_target
from tritongate.config import ModelConfig, load_model_config
from tritongate.registry import SERVICES, ServiceInfo
from tritongate.settings import DEPLOY_DIR, Settings, env_var, port_field, target_field
from tritongate.tls import ClientTls, client_tls, server_credentials
from tritongate.triton_local import TritonError, TritonLaunch, TritonProcess, start_triton, stop_on_signals

# The demo LLM (SmolLM2-135M-Instruct) behind each Triton LLM interface: `--demo-llm` name (the model
# configuration's `backend`) → model id, which is also its Triton model. The FasterTransformer one lives in
# deploy/triton with the other demo models; the other three in DEMO_LLM_REPOSITORY, loaded when asked.
DEMO_LLMS = {
    "fastertransformer": "smollm2-135m-instruct",
    "tensorrt_llm": "smollm2-135m-instruct-trtllm",
    "tensorrt_llm_text": "smollm2-135m-instruct-trtllm-ensemble",
    "vllm": "smollm2-135m-instruct-vllm",
}
# The demo configuration's: FasterTransformer's, and TensorRT-LLM's, whose guided decoding enforces tools and
# structured output (FasterTransformer has none).
DEFAULT_DEMO_LLMS = ("fastertransformer", "tensorrt_llm")
DEMO_REPOSITORY = DEPLOY_DIR / "triton"
DEMO_LLM_REPOSITORY = DEPLOY_DIR / "triton-llm-backends"
DEFAULT_CONFIG = DEPLOY_DIR / "model_config.json"
DEFAULT_TRITON_GRPC_PORT = Settings.model_fields["triton_grpc_port"].default  # what the demo configurations name
# The demo configuration with all four demo LLMs; `--demo-llm` keeps the chosen ones.
ALL_DEMO_LLMS_CONFIG = DEPLOY_DIR / "model_config.all.json"
TRITON = "triton"  # the stack's own Triton among its supervised processes


def parse_demo_llms(values: Iterable[str]) -> tuple[str, ...]:
    """`--demo-llm` values (each a name, a comma-separated list or `all`) as names in DEMO_LLMS order."""
    chosen: set[str] = set()
    for value in values:
        for name in filter(None, (part.strip() for part in value.split(","))):
            if name == "all":
                chosen.update(DEMO_LLMS)
            elif name in DEMO_LLMS:
                chosen.add(name)
            else:
                raise ValueError(f"unknown demo LLM {name!r}; choose from {', '.join(DEMO_LLMS)} or all")
    if not chosen:
        raise ValueError("no demo LLM given")
    return tuple(name for name in DEMO_LLMS if name in chosen)


def demo_llm_triton(settings: Settings, demo_llms: tuple[str, ...]) -> tuple[list[Path], list[str] | None]:
    """The Triton repositories to add and the models to load (None: every model, as Triton does by
    default) to serve `demo_llms`: the repositories' models, but the demo LLMs not chosen, and the chosen
    ones. With a model configuration or a repository of your own, the default adds nothing: the
    repositories are loaded whole."""
    own = Path(settings.config_file) != DEFAULT_CONFIG or settings.triton_model_repository != [DEMO_REPOSITORY]
    if demo_llms == DEFAULT_DEMO_LLMS and own:
        return [], None
    unwanted = {DEMO_LLMS[name] for name in DEMO_LLMS if name not in demo_llms}
    models = [path.name for repository in settings.triton_model_repository for path in sorted(repository.iterdir())
              if (path / "config.pbtxt").is_file() and path.name not in unwanted]
    extra = [DEMO_LLMS[name] for name in demo_llms if (DEMO_LLM_REPOSITORY / DEMO_LLMS[name]).is_dir()]
    return [DEMO_LLM_REPOSITORY], [*models, *(name for name in extra if name not in models)]


def demo_llm_config(settings: Settings, demo_llms: tuple[str, ...]) -> Path:
    """The model configuration for `demo_llms`: the one given (--config-file or $TRITONGATE_CONFIG_FILE)
    if any, else the demo configuration with those LLMs, pointed at the local Triton's gRPC port (written
    to the cache when it differs from the shipped file: a subset of the LLMs, or another port)."""
    if Path(settings.config_file) != DEFAULT_CONFIG:
        return Path(settings.config_file)
    source = DEFAULT_CONFIG if demo_llms == DEFAULT_DEMO_LLMS else ALL_DEMO_LLMS_CONFIG
    port = settings.triton_grpc_port
    moved = port != DEFAULT_TRITON_GRPC_PORT
    if demo_llms in (DEFAULT_DEMO_LLMS, tuple(DEMO_LLMS)) and not moved:
        return source
    config = json.loads(source.read_text())
    if source == ALL_DEMO_LLMS_CONFIG:
        ids = {DEMO_LLMS[name] for name in demo_llms}
        config["llm"] = [entry for entry in config["llm"] if entry["name"] in ids]
        config["model_infos"] = [info for info in config.get("model_infos", []) if info["name"] in ids]
    if moved:  # the demo entries name Triton's default ports
        for section in ("llm", "embedding", "rerank"):
            for entry in config.get(section, []):
                entry["grpc_url"] = f"127.0.0.1:{port}"
    for entry in config["llm"]:  # the copy is elsewhere: a template file stays where the shipped file names it
        if "chat_template" in entry:
            entry["chat_template"] = str(source.parent / entry["chat_template"])
    path = settings.cache_dir / f"model_config.demo-llm.{'+'.join(demo_llms)}.{port}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def say(message: str) -> None:
    print(f"[tritongate] {message}", flush=True)


def grpc_serving(address: str, tls: ClientTls | None = None) -> bool:
    """True when the gRPC health service at `address` answers SERVING."""
    return probe(address, 1.0, tls)[0]


def http_ok(url: str) -> bool:
    return probe(url, 1.0)[0]


def needed_services(config: ModelConfig) -> list[ServiceInfo]:
    """The services `config` needs: those whose section of the model configuration has entries."""
    return [service for service in SERVICES if getattr(config, service.section)]


@dataclass
class LocalStack:
    """Triton (unless one is given), the services the model configuration needs, and the edge."""

    settings: Settings
    triton: TritonProcess | None = None
    log_dir: Path | None = None  # None: children write to this terminal
    extra_repositories: list[Path] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)  # per service; else settings.metrics_port
    load_models: list[str] | None = None  # only these Triton models (explicit model control); None: all
    processes: dict[str, int] = field(default_factory=dict)  # edge workers, replicas per service; else 1
    supervisor: Supervisor = field(default_factory=Supervisor)  # restarts a process only in `heal()`
    own_triton: bool = False
    _metrics_dir: tempfile.TemporaryDirectory[str] | None = None  # shared by the edge workers

    @property
    def children(self) -> list[tuple[str, Process]]:
        """The services' and the edge's processes by label (after a restart, the new process)."""
        return [(child.name, child.process) for child in self.supervisor.children if child.name != TRITON]

    @property
    def edge_url(self) -> str:
        return f"http://{self.settings.edge_host}:{self.settings.edge_port}"

    def count(self, component: ServiceInfo | str) -> int:
        """Processes of a component: edge workers or replicas of a service."""
        return self.processes.get(component if isinstance(component, str) else component.name, 1)

    def replica_ports(self, service: ServiceInfo | str) -> list[int]:
        return replica_ports(self.settings.port(service), self.count(service))

    def service_address(self, service: ServiceInfo | str) -> str:
        """The gRPC target of `service` (a registry entry or its name): where it listens, or a list of
        its replicas' addresses, which the edge's channel balances over."""
        return replicas_target(self.settings.service_host, self.replica_ports(service))

    def env(self) -> dict[str, str]:
        """The children read their settings from the environment: hand them everything that matters."""
        s = self.settings
        values = {
            "TRITONGATE_CONFIG_FILE": s.config_file, "TRITONGATE_MODELS_DIR": s.models_dir,
            "TRITONGATE_EDGE_HOST": s.edge_host, "TRITONGATE_EDGE_PORT": s.edge_port,
            "TRITONGATE_SERVICE_HOST": s.service_host, "TRITONGATE_MAX_BODY_BYTES": s.max_body_bytes,
            **{env_var(port_field(service)): s.port(service) for service in SERVICES},
            **{env_var(target_field(service)): self.service_address(service) for service in SERVICES},
            "TRITONGATE_METRICS_REQUIRE_KEY": str(s.metrics_require_key).lower(),
            "TRITONGATE_STATE_URL": s.state_url,  # one store for every edge worker
        }
        optional = {  # only when set, so that an unset one does not become the string "None"
            "TRITONGATE_API_KEY": s.api_key.get_secret_value() if s.api_key else None,
            "TRITONGATE_API_KEY_FILE": s.api_key_file, "TRITONGATE_GRPC_TLS_CERT": s.grpc_tls_cert,
            "TRITONGATE_GRPC_TLS_KEY": s.grpc_tls_key, "TRITONGATE_GRPC_TLS_CA": s.grpc_tls_ca,
            "TRITONGATE_GRPC_TLS_SERVER_NAME": s.grpc_tls_server_name,
        }
        values.update({key: value for key, value in optional.items() if value is not None})
        return dict(os.environ, **{k: str(v) for k, v in values.items()}, **self.extra_env)

    def spawn(self, name: str, *args: str, label: str = "", env: dict[str, str] | None = None,
              after_exit: Callable[[Process], str] | None = None) -> Process:
        """`tritongate <name> <args>` as a supervised child process; `label` names it in `children` and its
        log file (a restart appends to it); `after_exit` cleans up after it exits."""
        label = label or name
        command = [sys.executable, "-m", "launcher.cli", name, *args]
        env = {**self.env(), **(env or {})}

        def start() -> Process:
            if self.log_dir is None:
                return subprocess.Popen(command, env=env)
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_dir / f"{label}.log", "ab") as log:
                return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

        return self.supervisor.add(label, start, after_exit)

    def _spawn_edge(self, flags: tuple[str, ...]) -> None:
        """The edge: one process, or workers sharing the port and a metrics directory (launcher/workers.py)."""
        args = ("--uvicorn-log-level", self.settings.uvicorn_log_level, *flags)
        workers = self.count("edge")
        if workers == 1:
            self.spawn("edge", *args)
            return
        self._metrics_dir = tempfile.TemporaryDirectory(prefix="tritongate-edge-metrics-")
        for i in range(workers):
            self.spawn("edge", *args, "--workers", "1", "--shared-port", label=f"edge-{i + 1}",
                       env={METRICS_DIR_ENV: self._metrics_dir.name},
                       after_exit=forget_worker_metrics(self._metrics_dir.name))

    def _spawn_service(self, service: ServiceInfo, flags: tuple[str, ...]) -> None:
        metrics_port = self.metrics_ports.get(service.name)
        ports = self.replica_ports(service)
        for i, port in enumerate(ports):
            metrics = ("--metrics-port", str(metrics_port + i * REPLICA_PORT_STEP)) if metrics_port else ()
            self.spawn(service.name, *flags, "--port", str(port), *metrics,
                       label=service.name if len(ports) == 1 else f"{service.name}-{i + 1}")

    def failed_child(self) -> str | None:
        for name, process in self.children:
            if process.poll() is not None:
                return f"{name} exited with code {process.returncode}"
        if self.triton and self.triton.process.poll() is not None:
            return f"Triton exited: {self.triton.last_error()}"
        return None

    def _start_triton(self) -> TritonProcess:
        """The stack's own Triton, supervised: a restart starts it again on the same ports (the services
        see it ready again by themselves) and logs to a file of its own (tritonserver.1.log, ...)."""
        logs: list[Path] = []  # the first start's, then each restart's

        def start() -> Process:
            first = self.log_dir / "tritonserver.log" if self.log_dir else None
            log_path = logs[0].with_suffix(f".{len(logs)}.log") if logs else first
            launch = TritonLaunch.from_settings(self.settings, self.extra_repositories, self.load_models)
            fresh = start_triton(replace(launch, extra_env=self.extra_env, log_path=log_path))
            logs.append(fresh.log_path)
            if self.triton is None:
                self.triton = fresh
            else:  # the same object, so that whoever holds it sees the new process
                self.triton.process, self.triton.log_path = fresh.process, fresh.log_path
            return fresh.process

        def exited(process: Process) -> str:
            assert self.triton is not None
            self.triton.kill()  # its Python-backend stubs (its process group) go with it
            log = f"log: {self.triton.log_path}"
            if process.returncode < 0:  # killed: the log's last error says nothing about why
                return log
            return f"{self.triton.last_error()} ({log})"

        self.supervisor.add(TRITON, start, exited)
        assert self.triton is not None
        return self.triton

    def wait(self, what: str, check: Callable[[], bool], timeout: float,
             cancelled: Callable[[], bool] = lambda: False) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not cancelled():
            if check():
                return
            failure = self.failed_child()
            if failure:
                raise TritonError(failure)
            time.sleep(0.2)
        if not cancelled():
            raise TritonError(f"{what} did not come up within {timeout:.0f} s")

    def start(self, cancelled: Callable[[], bool] = lambda: False, flags: tuple[str, ...] = ()) -> None:
        """Start everything and wait until the services are SERVING and the edge answers."""
        s = self.settings
        config = load_model_config(s.config_file)
        from edge.auth import load_api_keys

        load_api_keys(s)  # unreadable key or TLS files stop here, before anything starts
        server_credentials(s)
        tls = client_tls(s)
        if self.triton is None:
            self.own_triton = True
            self._start_triton().wait_ready(s.triton_start_timeout_s, cancelled)
        services = needed_services(config)
        for service in services:
            self._spawn_service(service, flags)
        self._spawn_edge(flags)
        for service in services:
            for port in self.replica_ports(service):
                address = f"{s.service_host}:{port}"
                self.wait(f"the {service.name} service at {address}",
                          lambda address=address: grpc_serving(address, tls),  # type: ignore[misc]
                          s.triton_start_timeout_s, cancelled)
        self.wait("the edge", lambda: http_ok(f"{self.edge_url}/health"), 120, cancelled)

    def __enter__(self) -> LocalStack:
        """Started; stopped again if it fails to start (nothing is left running either way)."""
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM in reverse order (edge first), wait for the drain, then stop Triton. A restart that
        waits for its delay is dropped."""
        self.supervisor.release(TRITON)  # stopped last, its own way (its stubs, their shared memory)
        self.supervisor.stop(self.settings.shutdown_grace_s + 5)
        if self._metrics_dir is not None:
            self._metrics_dir.cleanup()
            self._metrics_dir = None
        if self.triton and self.own_triton:
            self.triton.stop()


def run_stack(settings: Settings, fetch: bool = True, demo_llms: tuple[str, ...] = DEFAULT_DEMO_LLMS,
              processes: dict[str, int] | None = None) -> int:
    repositories, load_models = demo_llm_triton(settings, demo_llms)
    settings = settings.model_copy(update={"config_file": demo_llm_config(settings, demo_llms)})
    config = load_model_config(settings.config_file)  # fail fast, before starting anything
    if fetch:
        from tritongate.demo_models import fetch_models, missing_models

        if missing_models(settings.models_dir):
            fetch_models(settings.models_dir)
    stack = LocalStack(settings, extra_repositories=repositories, load_models=load_models,
                       processes=processes or {})
    stopping = stop_on_signals()
    try:
        components = ("edge", *(service.name for service in needed_services(config)))
        layout = ", ".join(f"{stack.count(name)} {name}" for name in components)
        say(f"starting Triton and the services ({layout} processes; the first start loads the demo models: "
            "about a minute)")
        flags = [flag for flag, on in (("--verbose", settings.verbose), ("--log-json", settings.log_json)) if on]
        stack.start(stopping, tuple(flags))
        if not stopping():
            from edge.auth import load_api_keys

            _announce(stack.edge_url, config, keyed=bool(load_api_keys(settings)))
        stack.supervisor.watch(stopping)  # a process that exits is restarted; CannotStart ends it
        say("stopping")
        return 0
    finally:
        stack.stop()


def _announce(url: str, config: ModelConfig, keyed: bool = False) -> None:
    say(f"ready: OpenAI API at {url}/v1 (docs: {url}/docs); Ctrl-C stops everything")
    if keyed:
        say("API keys are set: add -H 'Authorization: Bearer <key>' to the requests below")
    if len(config.llm) > 1:
        say(f"LLMs: {', '.join(entry.name for entry in config.llm)}")
    examples = [f"  curl {url}/v1/models"]
    if config.llm:
        question = '[{"role": "user", "content": "What is the capital of France?"}]'
        examples.append(f"""  curl {url}/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{{"model": "{config.llm[0].name}", "messages": {question}}}'""")
    if config.embedding:
        examples.append(f"""  curl {url}/v1/embeddings -H 'Content-Type: application/json' \\
       -d '{{"model": "{config.embedding[0].name}", "input": "The food was delicious"}}'""")
    print("\n" + "\n".join(examples) + "\n", flush=True)
