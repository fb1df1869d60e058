"""Runs one service process: read the model configuration, build the service, serve until SIGTERM.

Which section of the configuration a service reads, which module builds it and which port it listens
on all come from its entry in tritongate/registry.py.
"""

from __future__ import annotations

import importlib
import logging

from services.common.metrics import serve_metrics
from services.common.prefix_routing import RoutingRule
from services.common.server import ServerOptions, ServiceSpec, run_until_signalled, start_service
from services.common.tokenizer import keep_torch_out
from services.common.triton import Triton
from tritongate.config import ConfigError, ModelConfig, load_model_config
from tritongate.registry import BY_NAME, ServiceInfo
from tritongate.settings import Settings
from tritongate.tls import server_credentials

log = logging.getLogger(__name__)


def build_service(service: ServiceInfo, config: ModelConfig, triton: Triton) -> ServiceSpec:
    """The service's `build(config, triton)`, from the module its registry entry names."""
    spec: ServiceSpec = importlib.import_module(service.builder).build(config, triton)
    return spec


async def run_service(name: ServiceInfo | str, settings: Settings) -> None:
    """Serve `name` (a registry entry or its name) until SIGTERM."""
    service = BY_NAME[name] if isinstance(name, str) else name
    keep_torch_out()
    config = load_model_config(settings.config_file)
    if not getattr(config, service.section):
        raise ConfigError(f"{settings.config_file}: the `{service.section}` section is empty; "
                          f"nothing for the {service.name} service to serve")
    credentials = server_credentials(settings)  # before anything starts: a bad path fails fast
    triton = Triton(settings.triton_timeout_s, settings.triton_dns_refresh_s, RoutingRule.of(settings))
    spec = build_service(service, config, triton)
    if settings.metrics_port:
        serve_metrics(settings.service_host, settings.metrics_port)
        log.info("metrics on http://%s:%d/metrics", settings.service_host, settings.metrics_port)
    options = ServerOptions(
        credentials=credentials,
        max_connection_age_ms=settings.max_connection_age_ms,
        # An aged connection keeps its streams until they end; none outlasts the edge's request deadline.
        grace_s=max(settings.shutdown_grace_s, settings.request_timeout_s),
        max_in_flight=settings.max_in_flight,
    )
    running = await start_service(spec, triton, host=settings.service_host, port=settings.port(service),
                                  options=options)
    await run_until_signalled(running, settings.shutdown_grace_s)
