"""The container engine of the container tier, installed on first use: podman from Debian's packages,
podman-compose from PyPI, an offline base image, and the images the tier runs.

Nothing here needs a container registry. The base image is a Debian root file system built with
mmdebstrap (it stands in for `python:3.11-slim-bookworm`); the project's Dockerfile builds on it. What is
made is kept between runs in CACHE and in podman's image store, so a second run starts from there
(tests/README.md says how to remove it all).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tritongate.settings import REPO_ROOT

HERE = Path(__file__).parent
CACHE = Path(os.environ.get("TRITONGATE_CONTAINER_CACHE", Path.home() / ".cache" / "tritongate" / "containers"))
# Debian bookworm's podman is 4.3; netavark and aardvark-dns give containers DNS names on the network.
PACKAGES = ["podman", "buildah", "runc", "catatonit", "uidmap", "slirp4netns", "netavark", "aardvark-dns",
            "containernetworking-plugins", "fuse-overlayfs", "iptables", "mmdebstrap"]
# Debian's podman-compose (1.0.3) passes ${VAR:-} through literally and mangles health-check commands.
PODMAN_COMPOSE = "podman-compose==1.6.0"
# The tag of everything this tier builds, so that it never replaces a site's own `local` images.
TAG = "containers-test"
BASE_IMAGE = f"localhost/tritongate-base-python:{TAG}"
IMAGES = {
    "runtime": f"localhost/tritongate:{TAG}",
    "triton": f"localhost/tritongate-triton-standin:{TAG}",
    "valkey": f"localhost/tritongate-valkey-standin:{TAG}",
}


class Unavailable(Exception):
    """No container engine can run here; the message says why (the tier skips with it)."""


@dataclass
class Engine:
    """podman and podman-compose, with the settings this machine needs (CONTAINERS_CONF)."""

    compose_bin: Path
    env: dict[str, str] = field(default_factory=dict)

    def podman(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(["podman", *args], env=self.env, timeout=timeout, check=check)

    def image_exists(self, name: str) -> bool:
        return self.podman("image", "exists", name, check=False).returncode == 0


def run(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 600, check: bool = True,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure the error carries the end of its output."""
    result = subprocess.run(argv, env=env, cwd=cwd, timeout=timeout, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... exited {result.returncode}:\n"
                           f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return result


def install_packages() -> None:
    missing = [tool for tool in ("podman", "mmdebstrap", "runc") if shutil.which(tool) is None]
    if not missing:
        return
    if os.geteuid() != 0:
        raise Unavailable(f"{', '.join(missing)} not installed, and installing them (apt-get) needs root")
    if shutil.which("apt-get") is None:
        raise Unavailable(f"{', '.join(missing)} not installed, and this machine has no apt-get to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        run(["apt-get", "update", "-qq"], env=env)
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES], env=env)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"installing podman from Debian's packages failed: {exc}") from exc


def install_compose() -> Path:
    venv = CACHE / "podman-compose"
    binary = venv / "bin" / "podman-compose"
    if not binary.exists():
        try:
            run(["python3", "-m", "venv", str(venv)])
            run([str(venv / "bin" / "pip"), "install", "--quiet", PODMAN_COMPOSE])
        except RuntimeError as exc:
            shutil.rmtree(venv, ignore_errors=True)
            raise Unavailable(f"installing {PODMAN_COMPOSE} from PyPI failed: {exc}") from exc
    return binary


# Threads of every container running as one user count together; podman's own processes here run with
# 32768, which a container cannot exceed.
NPROC = 16384


def container_limits() -> dict[str, str]:
    """The most a container may have here: this process's hard limits (raising one needs
    CAP_SYS_RESOURCE), nproc at most NPROC ("-1": unlimited)."""
    kinds = {"memlock": resource.RLIMIT_MEMLOCK, "nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC}
    limits = {name: resource.getrlimit(kind)[1] for name, kind in kinds.items()}
    limits["nproc"] = NPROC if limits["nproc"] == resource.RLIM_INFINITY else min(limits["nproc"], NPROC)
    return {name: "-1" if value == resource.RLIM_INFINITY else str(value) for name, value in limits.items()}


def containers_conf() -> Path:
    """podman's defaults fitted to this machine: its default nofile and nproc are above what a container
    may have here, and runc runs the containers (crun 1.8 refuses a host that mounts cgroup v1 and v2 side
    by side)."""
    limits = [f'"{name}={value}:{value}"' for name, value in container_limits().items()
              if name != "memlock" and value != "-1"]
    path = CACHE / "containers.conf"
    path.write_text(f"[containers]\ndefault_ulimits = [{', '.join(limits)}]\n[engine]\nruntime = \"runc\"\n")
    return path


def provision() -> Engine:
    """The engine, installed if missing; Unavailable when it cannot be."""
    CACHE.mkdir(parents=True, exist_ok=True)
    install_packages()
    engine = Engine(install_compose(), {**os.environ, "CONTAINERS_CONF": str(containers_conf())})
    info = engine.podman("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False)
    if info.returncode != 0:
        raise Unavailable(f"podman is installed but does not run here: {info.stderr.strip()[-500:]}")
    return engine


def build_base_image(engine: Engine) -> None:
    """A bookworm root file system with Python 3.11, as a podman image (no registry involved). The
    machine's extra CA certificates go in, so that pip inside a build trusts what the machine trusts."""
    if engine.image_exists(BASE_IMAGE):
        return
    rootfs = CACHE / "rootfs.tar"
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    run(["mmdebstrap", "--variant=apt", "--include=python3,python3-venv,python-is-python3,libpython3.11,"
         "ca-certificates",
         *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "locale")),
         "--customize-hook=cp /usr/local/share/ca-certificates/*.crt \"$1/usr/local/share/ca-certificates/\""
         " 2>/dev/null || true",
         "--customize-hook=chroot \"$1\" update-ca-certificates",
         "--customize-hook=rm -rf \"$1\"/var/lib/apt/lists/* \"$1\"/var/cache/apt/*",
         "bookworm", str(rootfs), *([str(sources)] if sources.exists() else [])], timeout=900)
    try:
        engine.podman("import", "--change", 'CMD ["python3"]', "--change", "ENV LANG=C.UTF-8",
                      str(rootfs), BASE_IMAGE)
    finally:
        rootfs.unlink(missing_ok=True)


def standin_requirements() -> list[str]:
    """tritongate's dependencies and its `demo` extra (pyproject.toml): what the embedded Triton runs on."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["demo"]]


def wheelhouse() -> Path:
    """Those requirements as wheels, downloaded with this machine's pip settings (its index gives the CPU
    build of torch), for the Triton stand-in to install without reaching PyTorch's download site."""
    wheels = CACHE / "wheels"
    requirements = standin_requirements()
    stamp = wheels / ".requirements"
    if not stamp.exists() or stamp.read_text() != "\n".join(requirements):
        wheels.mkdir(exist_ok=True)
        run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", str(wheels),
             *requirements], timeout=1200)
        stamp.write_text("\n".join(requirements))
    return wheels


def build_images(engine: Engine) -> dict[str, str]:
    """The images the tier runs: the project's Dockerfile (runtime target) on the offline base, the Triton
    stand-in beside it, and the Valkey stand-in. podman's layer cache makes a rebuild quick; what earlier
    builds left untagged a day ago or more is removed, so that the store does not grow run after run."""
    engine.podman("image", "prune", "--force", "--filter", "until=24h", check=False)
    build_base_image(engine)
    engine.podman("build", "--pull=never", "--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}", "--target", "runtime",
                  "-t", IMAGES["runtime"], str(REPO_ROOT), timeout=1200)
    engine.podman("build", "--pull=never", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
                  "--build-arg", f"TRITONGATE_IMAGE={IMAGES['runtime']}",
                  "--build-arg", f"REQUIREMENTS={' '.join(standin_requirements())}",
                  "--volume", f"{wheelhouse()}:/wheels:ro",
                  "-t", IMAGES["triton"], str(HERE / "triton"), timeout=1200)
    engine.podman("build", "--pull=never", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
                  "-t", IMAGES["valkey"], str(HERE / "valkey"), timeout=600)
    return IMAGES
