"""Process settings: environment variables with the TRITONGATE_ prefix, overridden by CLI flags.

One place for every knob a process reads; docs/configuration.md lists them.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tritongate.batching import EDGE_SLOTS
from tritongate.registry import EMBED, LLM, RERANK, ServiceInfo

REPO_ROOT = Path(__file__).resolve().parent.parent
DEPLOY_DIR = REPO_ROOT / "deploy"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tritongate"


def default_state_url() -> str:
    """The edge's shared state when TRITONGATE_STATE_URL is unset: a SQLite file in tritongate's state
    folder ($XDG_STATE_HOME/tritongate, by default ~/.local/state/tritongate), which every edge process of
    this machine opens."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return f"sqlite://{Path(base).resolve() / 'tritongate' / 'edge-state.sqlite3'}"


def default_batch_files_dir() -> Path:
    """Where the Batch API keeps its files by default: `files/` in tritongate's state folder."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base).resolve() / "tritongate" / "files"


def default_models_dir() -> Path:
    return Path(os.environ.get("TRITONGATE_MODELS_DIR") or default_cache_dir() / "models")


CORES_PER_PROCESS = 4  # `auto` processes per component: one per this many cores
MAX_AUTO_PROCESSES = 8


def cores() -> int:
    """The cores this process may run on (a container's CPU set, not the host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def auto_workers(available: int | None = None) -> int:
    """Processes per component for `auto`. The load, Triton and every component share the cores: on 2
    cores one process each is best (measured: docs/benchmarks.md); from 8 cores one per 4 cores, up to
    MAX_AUTO_PROCESSES."""
    return max(1, min(MAX_AUTO_PROCESSES, (available or cores()) // CORES_PER_PROCESS))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRITONGATE_", extra="ignore")

    # The model configuration file (Denglin openai_api's model_config.json format), read by the services.
    config_file: Path = DEPLOY_DIR / "model_config.json"
    models_dir: Path = Field(default_factory=default_models_dir)
    cache_dir: Path = Field(default_factory=default_cache_dir)

    # Edge.
    edge_host: str = "127.0.0.1"
    edge_port: int = 5100
    # Seconds an idle client connection stays open. Longer than the clients' own idle limit (httpx, and so
    # the openai and anthropic SDKs: 5 s; load balancers: 60 s), so that the client always closes first:
    # with equal limits a request sent on a connection the edge is just closing fails with a reset.
    edge_keep_alive_s: int = Field(75, ge=1)
    # gRPC target of each service (one pair of fields per entry of tritongate/registry.py; read them with
    # `target()` and `port()`).
    llm_target: str = f"127.0.0.1:{LLM.default_port}"
    embed_target: str = f"127.0.0.1:{EMBED.default_port}"
    rerank_target: str = f"127.0.0.1:{RERANK.default_port}"
    # The LLM of a request that names none (LMDeploy's interactive chat, `tritongate chat`); unset: the first
    # LLM the llm service lists (the model configuration's order). /v1/models lists it first of the LLMs.
    default_llm: str | None = None
    # The embedding and rerank models of the requests that name none (TEI's /info, /embed, /tokenize and
    # /rerank, which serve one model each; /v1/embeddings without `model`); unset: the first the service lists.
    default_embedding_model: str | None = None
    default_rerank_model: str | None = None
    request_timeout_s: float = Field(600.0, description="Deadline for one generation request")
    # GenerateMany streams each edge process keeps open to the llm service, its generations started on them
    # in turn (edge/many.py); 0: a Generate call per generation.
    llm_streams: int = Field(2, ge=0)
    unary_timeout_s: float = Field(60.0, description="Deadline for one embed or rerank request")
    list_models_timeout_s: float = 2.0
    max_body_bytes: int = 32 * 1024 * 1024
    max_embedding_inputs: int = 2048
    max_rerank_documents: int = 1000
    sse_keepalive_s: float = 15.0
    # Where chat answers carry a reasoning model's thinking: `reasoning_content` (DeepSeek's API, read by
    # Dify, LlamaIndex, LangChain), `reasoning` (newer vLLM) or both.
    reasoning_field: Literal["reasoning_content", "reasoning", "both"] = "reasoning_content"
    # Where state that outlives a request lives, shared by every edge process pointed at it (edge/state/):
    # sqlite:///path (default: default_state_url(), one machine), redis://host:port/db (Redis or Valkey,
    # several machines) or memory:// (this process only).
    state_url: str = Field(default_factory=default_state_url)
    # Stored Responses (`store: true`, read back by `previous_response_id` and GET /v1/responses/{id}):
    # how many the store keeps, and for how long after their last use.
    responses_store_max: int = Field(1000, ge=1)
    responses_store_ttl_s: float = Field(3600.0, gt=0)
    # LMDeploy-style interactive sessions (/v1/chat/interactive), in the same store: how many at once, the
    # tokens one may hold (then it must be ended), and how long an unused one is kept.
    interactive_max_sessions: int = Field(1024, ge=1)
    interactive_max_session_tokens: int = Field(16384, ge=1)
    interactive_session_ttl_s: float = Field(1800.0, gt=0)
    # The Batch API (/v1/files, /v1/batches; edge/batches/). Its files live in a local folder, or in an
    # S3-compatible bucket when batch_files_url is `s3://bucket/prefix` (batch_s3_endpoint_url for a store
    # other than AWS; credentials from the usual AWS_* variables). The batches themselves live in the state
    # store. batch_file_max_bytes: the largest upload (413 beyond); batch_concurrency: the lines one edge
    # process runs at once; batch_lease_s: how long a batch stays with an edge process that stopped renewing
    # it (then another takes it over); batch_retention_s: how long files and batches are kept after last use.
    batch_files_dir: Path = Field(default_factory=default_batch_files_dir)
    batch_files_url: str | None = None
    batch_s3_endpoint_url: str | None = None
    batch_file_max_bytes: int = Field(200 * 1024 * 1024, ge=1)
    batch_concurrency: int = Field(4, ge=1)
    batch_lease_s: float = Field(30.0, gt=0)
    batch_retention_s: float = Field(30 * 24 * 3600.0, gt=0)
    # Seconds a client is told to wait (Retry-After) when a service refuses a request for overload.
    retry_after_s: int = Field(1, ge=0)
    uvicorn_log_level: str = "info"
    # The edge's access log, one line per request (logger tritongate.access); the metrics count every request
    # either way.
    access_log: bool = True
    # Embed and rerank calls in flight per model from one busy edge process (0.3 of a core or more);
    # requests that arrive while they are travel together in the next (edge/coalesce.py). An edge with CPU
    # to spare holds nothing back. The batching knobs and their defaults: tritongate/batching.py.
    calls_per_model: int = Field(EDGE_SLOTS, ge=1)
    # Edge processes sharing the port (`tritongate edge --workers`; launcher/workers.py); "auto": auto_workers().
    edge_workers: int = Field(1, ge=1)

    # Images in chat messages (edge/images.py): the bytes one image may have, the images one
    # request may carry, and the hosts whose http(s) URLs the edge fetches (none: only `data:` URLs).
    # Fetched URLs never reach a private, loopback or link-local address, unless it lies in one of
    # `image_allowed_networks` (CIDR, e.g. an internal image store's "10.1.2.0/24").
    image_max_bytes: int = Field(10 * 1024 * 1024, ge=1)
    image_max_count: int = Field(8, ge=0)
    image_allowed_hosts: list[str] = Field(default_factory=list)
    image_allowed_networks: list[str] = Field(default_factory=list)
    image_fetch_timeout_s: float = Field(10.0, gt=0)

    @field_validator("edge_workers", mode="before")
    @classmethod
    def _auto_workers(cls, value: object) -> object:
        return auto_workers() if value == "auto" else value
    # Bearer keys the edge accepts (several separated by commas) and/or a file of keys, one a line;
    # none set = no authentication. SecretStr keeps them out of reprs and logs.
    api_key: SecretStr | None = None
    api_key_file: Path | None = None
    metrics_require_key: bool = False
    # Priority and fair queuing (edge/queue.py): requests of one model that each edge process lets reach its
    # service at once (0 = no queue: all go on, and a full service answers 429 at once), how many may wait
    # for a slot, and for how long before a 429.
    queue_slots: int = Field(0, ge=0)
    queue_max_waiting: int = Field(1000, ge=0)
    queue_timeout_s: float = Field(30.0, gt=0)
    # TLS on the edge → service channels: the CA (and, for IP targets, the name in the services' certificate).
    grpc_tls_ca: Path | None = None
    grpc_tls_server_name: str | None = None

    # Services.
    service_host: str = "127.0.0.1"
    llm_port: int = LLM.default_port
    embed_port: int = EMBED.default_port
    rerank_port: int = RERANK.default_port
    # Clients reconnect (and find new replicas) at least this often; streams get `shutdown_grace_s`.
    max_connection_age_ms: int = 30_000
    shutdown_grace_s: float = 30.0
    triton_timeout_s: float = 60.0
    # How often the services look up again the DNS names of their models' Triton addresses (`dns:///host:port`),
    # so that Triton pods that come and go are found (services/common/triton_pool.py).
    triton_dns_refresh_s: float = Field(5.0, gt=0)
    # Which of a model's Triton endpoints takes a generation (docs/configuration.md, "Routing generations"):
    # `prefix_aware` keeps a conversation where its prompt's prefix is cached, unless that endpoint has more
    # than `imbalance_calls` and `imbalance_ratio` times the least-loaded one's calls in flight;
    # `least_loaded` always takes the one with the fewest (embeddings and reranking always do).
    triton_routing: Literal["prefix_aware", "least_loaded"] = "prefix_aware"
    triton_routing_imbalance_calls: int = Field(2, ge=0)
    triton_routing_imbalance_ratio: float = Field(1.5, ge=1)
    # Prompt tokens the llm service remembers per model, over its endpoints (about 2 bytes each).
    triton_routing_record_tokens: int = Field(4_000_000, ge=0)
    # A request header whose value names the conversation (e.g. a session id), read by the edge; unset: none.
    affinity_header: str | None = None
    # Inference RPCs one service process works on at once; more are refused (RESOURCE_EXHAUSTED → 429).
    max_in_flight: int = Field(256, gt=0)
    # Prometheus metrics of a service over HTTP on service_host:metrics_port; 0 = off.
    metrics_port: int = 0
    # TLS on a service's gRPC port: its certificate chain and private key (PEM); both or neither.
    grpc_tls_cert: Path | None = None
    grpc_tls_key: Path | None = None

    # Local Triton (`tritongate triton`).
    triton_http_port: int = 8000
    triton_grpc_port: int = 8001
    triton_metrics_port: int = 8002
    triton_model_repository: list[Path] = Field(default_factory=lambda: [DEPLOY_DIR / "triton"])
    triton_start_timeout_s: float = 600.0

    verbose: bool = False
    log_json: bool = False  # one JSON object per log line
    # OpenTelemetry tracing (the `otel` extra); the exporter follows the standard OTEL_* variables.
    otel: bool = False

    def port(self, service: ServiceInfo | str) -> int:
        """The port `service` listens on (TRITONGATE_<NAME>_PORT)."""
        return int(getattr(self, port_field(service)))

    def target(self, service: ServiceInfo | str) -> str:
        """The gRPC target the edge calls `service` at (TRITONGATE_<NAME>_TARGET)."""
        return str(getattr(self, target_field(service)))


# The one place that knows how a service's settings are named.
def port_field(service: ServiceInfo | str) -> str:
    return f"{service if isinstance(service, str) else service.name}_port"


def target_field(service: ServiceInfo | str) -> str:
    return f"{service if isinstance(service, str) else service.name}_target"


def env_var(field: str) -> str:
    """The environment variable of a settings field: TRITONGATE_<FIELD>."""
    return f"TRITONGATE_{field.upper()}"


@cache
def get_settings() -> Settings:
    return Settings()
