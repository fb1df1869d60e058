"""The images: the Dockerfile's stages, a non-root runtime without build tools or torch, what the build
copies, and the versions the tritongate and Triton images must share."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

from tests.deploy.test_compose import compose
from tests.deploy.test_k8s import TRITONGATE_IDS
from tritongate.settings import DEPLOY_DIR, REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
TRITON_DOCKERFILE = DEPLOY_DIR / "triton" / "Dockerfile"


def stages() -> dict[str, tuple[str, str]]:
    """Stage name → (what it is FROM, its instructions)."""
    text = DOCKERFILE.read_text()
    found = re.findall(r"^FROM (\S+) AS (\w+)\n(.*?)(?=^FROM |\Z)", text, flags=re.M | re.S)
    return {name: (base, body) for base, name, body in found}


def chain(name: str) -> list[str]:
    """The stage and those it builds on, within the Dockerfile."""
    names = [name]
    while stages()[names[-1]][0] in stages():
        names.append(stages()[names[-1]][0])
    return names


def arg(text: str, name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", text, flags=re.M)
    assert match, name
    return match[1]


def test_runtime_is_the_default_target_non_root_and_has_no_build_tools() -> None:
    assert list(stages())[-1] == "runtime"  # `docker build .` builds it
    assert chain("runtime") == ["runtime", "base"]
    assert arg(DOCKERFILE.read_text(), "PYTHON_IMAGE").startswith("python:3.11-slim")
    runtime = "".join(stages()[name][1] for name in chain("runtime"))
    assert re.search(r"^USER tritongate$", stages()["runtime"][1], flags=re.M)
    # The user and group the Kubernetes manifests run it as (runAsUser, runAsGroup: tests/deploy/test_k8s.py).
    assert re.search(rf"groupadd --system --gid {TRITONGATE_IDS} tritongate", runtime)
    assert re.search(rf"useradd --system --uid {TRITONGATE_IDS} --gid {TRITONGATE_IDS} ", runtime)
    for tool in ("apt-get", "gcc", "build-essential", "protoc", "torch", "pip install"):
        assert tool not in runtime, tool
    # Only the build stage installs, from wheels only; the runtime copies its virtualenv.
    assert "COPY --from=build /opt/tritongate /opt/tritongate" in runtime
    assert "PIP_ONLY_BINARY=:all:" in stages()["build"][1]


def test_the_dockerfiles_build_without_a_registry_for_the_frontend() -> None:
    """A `# syntax=` line makes BuildKit pull that frontend image before anything else, which fails where
    no registry is reachable; the frontend built into Docker reads these files as they are."""
    for path in (DOCKERFILE, TRITON_DOCKERFILE):
        assert not re.search(r"^#\s*syntax\s*=", path.read_text(), flags=re.M | re.I), path


def test_compose_builds_targets_that_exist() -> None:
    for name, spec in compose()["services"].items():
        build = spec.get("build", {})
        if build.get("context") == "..":
            assert build["target"] in stages(), name


def test_the_build_copies_the_packages_pyproject_installs() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = re.findall(r"^COPY (\S+) \./\S*$", stages()["build"][1], flags=re.M)
    assert packages <= set(copied)
    assert "pyproject.toml" in stages()["build"][1] and project["project"]["readme"] in stages()["build"][1]
    ignore = (REPO_ROOT / ".dockerignore").read_text().split()
    for path in [*copied, "pyproject.toml", project["project"]["readme"]]:
        assert f"!{path}" in ignore or f"!{path}/" in ignore, path
        assert (REPO_ROOT / path).exists(), path


def test_the_models_image_writes_what_the_triton_image_reads() -> None:
    models, triton = stages()["models"][1], TRITON_DOCKERFILE.read_text()
    for name in ("TORCH_VERSION", "TRANSFORMERS_VERSION"):
        assert arg(models, name) == arg(triton, name), name
    demo = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["demo"]
    assert f"torch=={arg(triton, 'TORCH_VERSION')}" in demo  # the torch the tests run the demo models with


def test_components_do_not_import_torch() -> None:
    """The runtime image has no torch: importing every component must not need it."""
    modules = ["edge.app", "services.runner", "launcher.cli", "launcher.healthcheck", "launcher.stack",
               *(f"services.{p.parent.name}.main" for p in sorted((REPO_ROOT / "services").glob("*/main.py")))]
    code = f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n" \
           "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert result.stdout.strip() == "[]"
    assert "services.embed.main" in modules
