import os, sys  # noqa: E401, I001  (must come first; see below)

_site = os.environ.get("TRITONGATE_SITE_PACKAGES")
if _site:  # the Python-backend stub runs the base interpreter; use the venv's packages first
    sys.path.insert(0, _site)
sys.dont_write_bytecode = True  # a __pycache__ folder in the model repository would be taken for a model
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))))

"""scripted-agent: the deterministic agent test model; see echo_scripted.py."""

from echo_scripted import ScriptedAgentModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
