"""The layers (docs/architecture.md): who may import whom, what the edge process loads, the service
registry that every part reads, and the 200 schema of every documented operation."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tritongate.registry import SERVICES
from tritongate.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
# Package → top-level packages it must not import.
FORBIDDEN = {
    "tritongate": {"edge", "services", "launcher"},  # the base both sides share
    "edge": {"services", "launcher", "tritonclient"},
    "services": {"edge", "launcher"},
}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_package_imports_a_layer_above_or_beside_it(package: str) -> None:
    offences = [f"{path.relative_to(ROOT)} imports {name}"
                for path in sorted((ROOT / package).rglob("*.py"))
                for name in _imports(path) & FORBIDDEN[package]]
    assert not offences


# The edge's modules that its endpoint modules build on: none of them imports an endpoint or a router.
EDGE_BASE = ["edge/errors.py", "edge/generation.py", "edge/images.py", "edge/app_state.py", "edge/state"]


def _modules_imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_the_edges_base_imports_no_endpoint_and_no_router() -> None:
    paths = [path for base in EDGE_BASE for path in sorted((ROOT / base).rglob("*.py") if (ROOT / base).is_dir()
                                                               else [ROOT / base])]
    offences = [f"{path.relative_to(ROOT)} imports {name}" for path in paths for name in _modules_imported(path)
                if name.startswith(("edge.endpoints", "edge.routers"))]
    assert len(paths) > len(EDGE_BASE) and not offences


def test_the_edge_process_loads_no_service_code_and_no_tritonclient() -> None:
    script = """
import json, sys
from prometheus_client import REGISTRY
from edge.app import create_app
from tritongate.settings import Settings
create_app(Settings())
families = sorted(m.name for m in REGISTRY.collect())
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("services", "tritonclient", "launcher", "torch"))
print(json.dumps({"loaded": loaded, "families": families}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["loaded"] == []
    assert not [name for name in seen["families"] if name.startswith(("grpc_server", "tritongate_triton",
                                                                       "tritongate_batch"))]
    assert "http_requests" in seen["families"]


@pytest.mark.parametrize("service", SERVICES, ids=lambda s: s.name)
def test_every_registered_service_is_complete(service) -> None:  # type: ignore[no-untyped-def]
    settings = Settings()
    assert settings.port(service) == service.default_port
    assert settings.target(service).endswith(f":{service.default_port}")
    assert importlib.util.find_spec(service.builder) is not None
    assert service.grpc_service.endswith("Service") and service.idempotent


def test_ports_and_kinds_are_distinct() -> None:
    assert len({s.default_port for s in SERVICES}) == len({s.kind for s in SERVICES}) == len(SERVICES)


def test_every_operation_declares_its_200_schema() -> None:
    from edge.app import create_app

    document = create_app(Settings()).openapi()
    operations = [(method, path, op) for path, ops in document["paths"].items() for method, op in ops.items()]
    assert len(operations) >= 9
    for method, path, operation in operations:
        ok = operation["responses"].get("200", {})
        schema = ok.get("content", {}).get("application/json", {}).get("schema")
        assert schema, f"{method.upper()} {path} declares no 200 schema"
        refs = json.dumps(schema)
        assert "#/components/schemas/" in refs, f"{method.upper()} {path}: {schema}"
        for ref in {part.split('"')[0] for part in refs.split("#/components/schemas/")[1:]}:
            assert ref in document["components"]["schemas"], ref
