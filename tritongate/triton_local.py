"""A real Triton Inference Server on this machine, from the `tritonserver` binary inside the
nvidia-pytriton wheel, serving a normal model repository on the CPU.

Two things make the wheel's binary work with a virtualenv (see docs/embedded-triton.md):
- the Python-backend stub must load the running interpreter's libpython, so its LIBDIR goes first on
  LD_LIBRARY_PATH (the wheel bundles another libpython that crashes the stub);
- the stub runs the `python3` it finds on the PATH, in isolated mode: the running interpreter's folder
  goes first on the PATH, and the demo models also put its site-packages first on sys.path themselves,
  from TRITONGATE_SITE_PACKAGES.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from tritongate import procs
from tritongate.settings import Settings


class TritonError(Exception):
    """Triton could not be found or started; the message is one line for the user."""


def _dist_dir() -> Path:
    try:
        import pytriton
    except ImportError:
        raise TritonError(
            "no tritonserver binary: install the demo extra (pip install -e '.[demo]'), which brings "
            "nvidia-pytriton, or point the services at an existing Triton"
        ) from None
    dist = Path(pytriton.__file__).parent / "tritonserver"
    if not (dist / "bin" / "tritonserver").exists():
        raise TritonError(f"the nvidia-pytriton wheel has no tritonserver binary under {dist}")
    return dist


def prepare_server(cache_dir: Path) -> Path:
    """A copy of the wheel's server with the Python-backend stub for this interpreter; made once."""
    dist = _dist_dir()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise TritonError(f"the nvidia-pytriton wheel has no Python-backend stub for Python {version}")
    target = cache_dir / f"tritonserver-py{version}"
    marker = target / ".complete"
    if marker.exists() and marker.read_text() == str(dist):
        return target
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(dist, target, ignore=shutil.ignore_patterns("python_backend_stubs"))
    shutil.copy2(stub, target / "backends" / "python" / "triton_python_backend_stub")
    marker.write_text(str(dist))
    return target


def _put_first(env: dict[str, str], variable: str, *folders: str) -> None:
    """`folders` (empty ones skipped) ahead of what the search-path `variable` already holds."""
    env[variable] = os.pathsep.join(p for p in (*folders, env.get(variable, "")) if p)


def server_env(models_dir: Path) -> dict[str, str]:
    libs = Path(_dist_dir()).parent.parent / "nvidia_pytriton.libs"
    env = dict(os.environ)
    _put_first(env, "LD_LIBRARY_PATH", sysconfig.get_config_var("LIBDIR") or "", str(libs))
    # The stub takes its interpreter's prefix, and so its site-packages, from the `python3` on the PATH:
    # this interpreter's, not that of whichever environment is active.
    _put_first(env, "PATH", os.path.dirname(sys.executable))
    env["TRITONGATE_SITE_PACKAGES"] = sysconfig.get_paths()["purelib"]
    env["TRITONGATE_MODELS_DIR"] = str(models_dir)
    return env


def python_backend_shm(pids: Sequence[int]) -> set[Path]:
    """The Python backend's shared-memory files that the processes `pids` map."""
    regions = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
            regions |= {Path(line.split()[-1]) for line in maps if "/dev/shm/triton_python_backend" in line}
    return regions


@dataclass
class TritonProcess:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log_path: Path

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _ready(self) -> bool:
        url = f"http://127.0.0.1:{self.http_port}/v2/health/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def last_error(self) -> str:
        """The most telling line of Triton's log, for a one-line failure message."""
        with contextlib.suppress(OSError):
            lines = self.log_path.read_text(errors="replace").splitlines()
            errors = [line for line in lines if line.startswith("E") or "error" in line.lower()]
            return (errors or lines or ["(empty log)"])[-1].strip()
        return "(no log)"

    def wait_ready(self, timeout: float, cancelled: Callable[[], bool] = lambda: False) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not cancelled():
            if self.process.poll() is not None:
                raise TritonError(f"tritonserver exited with code {self.process.returncode}: "
                                  f"{self.last_error()} (log: {self.log_path})")
            if self._ready():
                return
            time.sleep(0.5)
        if cancelled():
            return
        self.stop()
        raise TritonError(f"tritonserver was not ready after {timeout:.0f} s: {self.last_error()} "
                          f"(log: {self.log_path})")

    def _shm_regions(self) -> set[Path]:
        """The Python backend's shared-memory files that Triton and its stubs map (the stubs outlive a
        Triton that was killed, until its process group is)."""
        return python_backend_shm(procs.group(self.process.pid))

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM lets Triton unload models and stop its Python stubs; then the group is killed."""
        self._end(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """Die at once, as in a crash (SIGKILL to the whole group)."""
        self._end(signal.SIGKILL, 0)

    def _end(self, sig: signal.Signals, timeout: float) -> None:
        regions = self._shm_regions()  # a crashed Triton's stubs still map them
        if self.process.poll() is None:
            self.process.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        # A stub that did not shut down cleanly leaves its region behind: 1 MiB of RAM each, until reboot.
        for region in regions:
            with contextlib.suppress(OSError):
                region.unlink()


@dataclass(frozen=True)
class TritonLaunch:
    """What `start_triton` starts: tritonserver serving the model `repositories` on three ports.

    `exit_timeout_s` bounds how long Triton waits on SIGTERM for models to unload. The Python backend
    now and then keeps a decoupled model "live" after every request has ended, and Triton then waits
    the whole timeout (30 s by default); a stack stops its services first, so nothing is in flight.

    `load_models`: load only these models of the repositories (Triton's explicit model control);
    None loads every model in them."""

    repositories: Sequence[Path]
    models_dir: Path  # the demo models' weights (TRITONGATE_MODELS_DIR)
    cache_dir: Path  # the server's copy (prepare_server) and, by default, its log
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path | None = None  # default: cache_dir/logs/tritonserver-<grpc port>.log
    extra_env: Mapping[str, str] = field(default_factory=dict)
    exit_timeout_s: int = 5
    load_models: Sequence[str] | None = None

    @classmethod
    def from_settings(cls, settings: Settings, extra_repositories: Sequence[Path] = (),
                      load_models: Sequence[str] | None = None) -> TritonLaunch:
        """The Triton the settings describe: their repositories (then `extra_repositories`), folders and
        ports."""
        return cls(repositories=[*settings.triton_model_repository, *extra_repositories],
                   models_dir=settings.models_dir, cache_dir=settings.cache_dir,
                   http_port=settings.triton_http_port, grpc_port=settings.triton_grpc_port,
                   metrics_port=settings.triton_metrics_port, load_models=load_models)

    def command(self, server: Path) -> list[str]:
        """The command line of `server` (prepare_server's folder)."""
        args = [
            str(server / "bin" / "tritonserver"),
            *(f"--model-repository={repo}" for repo in self.repositories),
            f"--backend-directory={server / 'backends'}",
            f"--cache-directory={server / 'caches'}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            f"--exit-timeout-secs={self.exit_timeout_s}",
        ]
        if self.load_models is not None:
            args += ["--model-control-mode=explicit", *(f"--load-model={name}" for name in self.load_models)]
        return args


def start_triton(launch: TritonLaunch) -> TritonProcess:
    """Start tritonserver in its own process group (so its stubs go with it); does not wait."""
    server = prepare_server(launch.cache_dir)
    for repo in launch.repositories:
        if not Path(repo).is_dir():
            raise TritonError(f"model repository {repo} does not exist")
    log_path = launch.log_path or launch.cache_dir / "logs" / f"tritonserver-{launch.grpc_port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = server_env(launch.models_dir) | dict(launch.extra_env)
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(launch.command(server), stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    return TritonProcess(process, launch.http_port, launch.grpc_port, log_path)


def stop_on_signals() -> Callable[[], bool]:
    """From now on SIGTERM and SIGINT only raise a flag; a foreground command polls it and stops cleanly."""
    raised = False

    def request_stop(*_: object) -> None:
        nonlocal raised
        raised = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return lambda: raised


def run_triton_foreground(settings: Settings, extra_repositories: Sequence[Path] = (),
                          load_models: Sequence[str] | None = None) -> None:
    """`tritongate triton`: start, wait for the models, run until Ctrl-C or SIGTERM."""
    launch = TritonLaunch.from_settings(settings, extra_repositories, load_models)
    # Triton's default exit timeout: on its own, clients may still have requests in flight.
    triton = start_triton(replace(launch, exit_timeout_s=30))
    stop_requested = stop_on_signals()
    try:
        print(f"starting Triton (log: {triton.log_path})", flush=True)
        triton.wait_ready(settings.triton_start_timeout_s, stop_requested)
        print(f"Triton ready: gRPC 127.0.0.1:{triton.grpc_port}, HTTP 127.0.0.1:{triton.http_port}", flush=True)
        while not stop_requested() and triton.process.poll() is None:
            time.sleep(0.5)
        if triton.process.poll() is not None and not stop_requested():
            raise TritonError(f"tritonserver exited with code {triton.process.returncode}: {triton.last_error()}")
    finally:
        triton.stop()
