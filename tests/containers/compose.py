"""deploy/compose.yaml run by podman-compose as its own project, and what the tests read off it: the
containers of a service, their health, an edge replica's published port, a service replica's metrics,
and what a teardown left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from tests.containers.engine import CACHE, Engine, container_limits, run
from tests.support.ports import wait_until
from tritongate.settings import DEPLOY_DIR

PROJECT = "tritongate-containers-test"
OVERRIDE = CACHE / "compose.sandbox.yaml"
LABEL = f"label=io.podman.compose.project={PROJECT}"
# Reads a service replica's own Prometheus counters from inside its container.
READ_METRICS = ("import urllib.request as u; "
                "print(u.urlopen('http://127.0.0.1:9090/metrics', timeout=5).read().decode())")


def sandbox_override(triton_image: str) -> Path:
    """The few things this machine cannot do as compose.yaml says them, as an override file beside it;
    everything else runs unchanged (the stand-in images come in through compose.yaml's own variables)."""
    limits = {name: int(value) for name, value in container_limits().items()}
    override = {"services": {
        # The `models` target installs torch from PyTorch's download site, unreachable here; the Triton
        # stand-in has the same torch, transformers and gguf, and tritongate (it has no entry point).
        "models": {"image": triton_image, "entrypoint": ["tritongate"]},
        # An unlimited memlock needs CAP_SYS_RESOURCE: Triton gets the machine's own. And a service's
        # `ulimits` replace the engine's defaults, so the machine's nofile and nproc are named again.
        "triton": {"ulimits": {"memlock": limits["memlock"], "nofile": limits["nofile"], "nproc": limits["nproc"]}},
    }}
    OVERRIDE.write_text("# Written by tests/containers/compose.py: what this machine cannot do as compose.yaml says.\n"
                        + yaml.safe_dump(override, sort_keys=False))
    return OVERRIDE


@dataclass
class Compose:
    engine: Engine
    env: dict[str, str]  # compose.yaml's variables: the stand-in images, the test tag, publish addresses
    override: Path

    def __call__(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
        files = ["-f", str(DEPLOY_DIR / "compose.yaml"), "-f", str(self.override)]
        return run([str(self.engine.compose_bin), "-p", PROJECT, *files, *args], cwd=DEPLOY_DIR,
                   env={**self.engine.env, **self.env}, timeout=timeout, check=check)

    def up(self, *args: str) -> None:
        """`up -d --no-deps`: with podman, depends_on becomes `--requires`, and podman cannot restart a
        crashed container whose dependency has exited (the one-shot `models`); without it nothing waits
        for anything, and a part that starts too early exits and is restarted (deploy/README.md)."""
        self("up", "-d", "--no-deps", *args)

    def containers(self, service: str | None = None, *, running: bool = True) -> list[str]:
        """The project's containers (of one service), by replica number."""
        filters = ["--filter", LABEL] + (["--filter", f"label=com.docker.compose.service={service}"] if service else [])
        listed = self.engine.podman("ps", *([] if running else ["-a"]), *filters, "--format",
                                    '{{.Names}} {{index .Labels "com.docker.compose.container-number"}}').stdout
        rows = [line.split() for line in listed.splitlines() if line.strip()]
        return [name for name, _ in sorted(rows, key=lambda row: int(row[1]))]

    def healthy(self, container: str) -> bool:
        """The container's compose health check passes now (run by hand: without systemd, podman runs
        no health check by itself)."""
        return self.engine.podman("healthcheck", "run", container, check=False, timeout=60).returncode == 0

    def wait_healthy(self, containers: list[str], timeout: float) -> None:
        for container in containers:
            wait_until(partial(self.healthy, container), timeout, f"health check of {container}")

    def state(self, container: str) -> dict[str, Any]:
        return dict(json.loads(self.engine.podman("inspect", "--format", "{{json .State}}", container).stdout))

    def restarts(self, container: str) -> int:
        """How often the engine has restarted the container (its restart policy)."""
        return int(self.engine.podman("inspect", "--format", "{{.RestartCount}}", container).stdout)

    def crash(self, container: str) -> None:
        """Kill the container's main process, as a crash would. (`podman kill` counts as stopping the
        container by hand, and a restart policy leaves such a container stopped.)"""
        os.kill(int(self.state(container)["Pid"]), signal.SIGKILL)

    def edge_url(self, container: str) -> str:
        """The base URL of an edge replica, on the loopback port the engine published for it."""
        published = self.engine.podman("port", container, "5100/tcp").stdout.split()[0]
        host, port = published.rsplit(":", 1)
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"

    def handled(self, container: str, method: str) -> int:
        """How many `method` calls a service replica has answered (its grpc_server_handled_total); 0 while
        its metrics cannot be read yet (a replica still starting has answered nothing)."""
        text = self.engine.podman("exec", container, "python", "-c", READ_METRICS, timeout=60, check=False).stdout
        pattern = rf'grpc_server_handled_total{{[^}}]*grpc_method="{method}"[^}}]*}} (\S+)'
        return int(sum(float(value) for value in re.findall(pattern, text)))

    def down(self, check: bool = True) -> None:
        """`down -v`, with --remove-orphans: podman-compose's `down` alone misses the replicas that `--scale`
        added (its own list of containers has one per service)."""
        self("down", "-v", "--remove-orphans", timeout=900, check=check)

    def sweep(self) -> None:
        """Remove whatever `down` left of the project (nothing, when it works as it should)."""
        left = self.leftovers()
        if left["containers"]:
            self.engine.podman("rm", "-f", "-t", "10", *left["containers"], check=False, timeout=300)
        for kind in ("pod", "network", "volume"):
            if left[f"{kind}s"]:
                self.engine.podman(kind, "rm", "-f", *left[f"{kind}s"], check=False)

    def leftovers(self) -> dict[str, list[str]]:
        """The project's containers, pods, networks and volumes that still exist."""
        def names(*argv: str) -> list[str]:
            return self.engine.podman(*argv, check=False).stdout.split()

        return {
            "containers": names("ps", "-a", "--filter", LABEL, "--format", "{{.Names}}"),
            "pods": [pod for pod in names("pod", "ls", "--format", "{{.Name}}") if PROJECT in pod],
            "networks": [net for net in names("network", "ls", "--format", "{{.Name}}") if net.startswith(PROJECT)],
            "volumes": sorted(set(names("volume", "ls", "--filter", LABEL, "--format", "{{.Name}}"))
                              | {v for v in names("volume", "ls", "--format", "{{.Name}}") if v.startswith(PROJECT)}),
        }
