"""The embedded Triton (tritongate/triton_local.py) with the real tritonserver: its Python-backend stubs
run in this interpreter's environment, whatever `python3` comes first on the PATH.

The stub takes its interpreter's prefix (and so its site-packages) from the `python3` it finds on the
PATH. A gateway started as `.venv/bin/tritongate up`, without the virtualenv activated, would otherwise
run the demo models in another environment's packages: another numpy, a scikit-learn built for it.
"""

from __future__ import annotations

import json
import os
import sys
import venv
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tritongate.settings import default_cache_dir
from tritongate.triton_local import TritonLaunch, start_triton

PROBE_CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "x", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "y", data_type: TYPE_INT32, dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
parameters { key: "report" value: { string_value: "%s" } }
"""

# Writes where its interpreter lives and what it imports from, at load time.
PROBE_MODEL = """import json
import sys


class TritonPythonModel:
    def initialize(self, args):
        report = json.loads(args["model_config"])["parameters"]["report"]["string_value"]
        with open(report, "w") as file:
            json.dump({"prefix": sys.prefix, "path": sys.path}, file)

    def execute(self, requests):
        return []
"""


def test_the_stubs_run_in_this_interpreters_environment_not_the_first_python3_on_the_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    decoy = tmp_path / "decoy"  # another environment, first on the PATH
    venv.create(decoy, with_pip=False, symlinks=True)
    monkeypatch.setenv("PATH", f"{decoy / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    report = tmp_path / "report.json"
    model = tmp_path / "repository" / "probe"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(PROBE_CONFIG % report)
    (model / "1" / "model.py").write_text(PROBE_MODEL)

    triton = start_triton(TritonLaunch(repositories=[model.parent], models_dir=tmp_path, cache_dir=default_cache_dir(),
                                       http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                                       log_path=tmp_path / "tritonserver.log"))
    try:
        triton.wait_ready(120)
    finally:
        triton.stop()

    seen = json.loads(report.read_text())
    assert Path(seen["prefix"]).resolve() == Path(sys.prefix).resolve()
    assert not [entry for entry in seen["path"] if entry.startswith(str(decoy))]
