import os
import sys

_site = os.environ.get("TRITONGATE_SITE_PACKAGES")
if _site:  # the Python-backend stub runs the base interpreter; use the venv's packages first
    sys.path.insert(0, _site)
sys.dont_write_bytecode = True  # a __pycache__ folder in the model repository would be taken for a model

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

DIM = 384


class TritonPythonModel:
    """Each text's vector is its bag of token ids (id modulo 384), normalized: a few microseconds a row.
    With the `wait_ms` parameter, each execution first sleeps that long: a model that takes time but no
    CPU (bench/latency.py)."""

    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.wait = float(parameters.get("wait_ms", {}).get("string_value", "0")) / 1000

    def execute(self, requests):
        if self.wait:
            time.sleep(self.wait)
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()
            vectors = np.zeros((ids.shape[0], DIM), dtype=np.float32)
            rows = np.repeat(np.arange(ids.shape[0]), ids.shape[1])
            np.add.at(vectors, (rows, (ids % DIM).ravel()), mask.ravel().astype(np.float32))
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("sentence_embedding", vectors)]))
        return responses
