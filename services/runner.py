"""Runs one service process: read the model configuration, build the service, serve until SIGTERM."""

from __future__ import annotations

import importlib
import logging

from services.common.metrics import serve_metrics
from services.common.server import ServiceSpec, run_until_signalled, start_service
from services.common.tokenizer import keep_torch_out
from services.common.triton import Triton
from tritongate.config import ConfigError, ModelConfig, load_model_config
from tritongate.settings import Settings
from tritongate.tls import server_credentials

log = logging.getLogger(__name__)

SECTIONS = {"llm": "llm", "embed": "embedding", "rerank": "rerank"}


def build_service(name: str, config: ModelConfig, triton: Triton) -> ServiceSpec:
    module = importlib.import_module(f"services.{name}.main")
    spec: ServiceSpec = module.build(config, triton)
    return spec


async def run_service(name: str, settings: Settings) -> None:
    keep_torch_out()
    config = load_model_config(settings.config_file)
    if not getattr(config, SECTIONS[name]):
        raise ConfigError(f"{settings.config_file}: the `{SECTIONS[name]}` section is empty; "
                          f"nothing for the {name} service to serve")
    credentials = server_credentials(settings)  # before anything starts: a bad path fails fast
    triton = Triton(settings.triton_timeout_s)
    spec = build_service(name, config, triton)
    if settings.metrics_port:
        serve_metrics(settings.service_host, settings.metrics_port)
        log.info("metrics on http://%s:%d/metrics", settings.service_host, settings.metrics_port)
    service = await start_service(
        spec, triton,
        host=settings.service_host,
        port=getattr(settings, f"{name}_port"),
        max_connection_age_ms=settings.max_connection_age_ms,
        # An aged connection keeps its streams until they end; none outlasts the edge's request deadline.
        grace_s=max(settings.shutdown_grace_s, settings.request_timeout_s),
        credentials=credentials,
        max_in_flight=settings.max_in_flight,
    )
    await run_until_signalled(service, settings.shutdown_grace_s)
