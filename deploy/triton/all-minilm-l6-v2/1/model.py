import os
import site
import sys

_site = os.environ.get("TRITONGATE_SITE_PACKAGES")
if _site:  # the Python-backend stub runs the base interpreter: the venv's packages first, and its .pth
    sys.path.insert(0, _site)  # files (an editable install of tritongate) through site.addsitedir
    site.addsitedir(_site)

import json

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModel

from tritongate.demo_models.device import placement


class TritonPythonModel:
    """BERT encoder: padded forward pass over every request in the batch."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        folder = config["parameters"]["model_folder"]["string_value"]
        path = os.path.join(os.environ.get("TRITONGATE_MODELS_DIR", "/models"), folder)
        if not os.path.isdir(path):
            raise pb_utils.TritonModelException(f"model folder {path} not found: run `tritongate models fetch`")
        torch.set_num_threads(1)
        params = {k: v.get("string_value", "") for k, v in config["parameters"].items()}
        try:  # the CPU in float32, or a GPU in float16 (the `device` and `dtype` parameters)
            self.device, dtype = placement(params, cpu_dtype="float32", cuda_dtype="float16", args=args)
        except ValueError as exc:
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc
        self.model = AutoModel.from_pretrained(path, dtype=dtype).eval().to(self.device)

    def execute(self, requests):
        batch = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()
            types = pb_utils.get_input_tensor_by_name(request, "token_type_ids")
            types = types.as_numpy() if types is not None else np.zeros_like(ids)
            batch.append((ids, mask, types))
        rows = sum(ids.shape[0] for ids, _, _ in batch)
        width = max(ids.shape[1] for ids, _, _ in batch)
        padded = [np.zeros((rows, width), dtype=np.int64) for _ in range(3)]
        row = 0
        for tensors in batch:
            n, length = tensors[0].shape
            for target, source in zip(padded, tensors, strict=True):
                target[row:row + n, :length] = source
            row += n
        ids, mask, types = (torch.from_numpy(a).to(self.device) for a in padded)
        with torch.inference_mode():
            hidden = self.model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
            hidden = hidden.float()  # the outputs are FP32; pooling in float32 whatever the model's dtype
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        hidden, pooled = hidden.cpu().numpy(), pooled.cpu().numpy()

        responses, row = [], 0
        for request, (ids, _, _) in zip(requests, batch, strict=True):
            n, length = ids.shape
            wanted = set(request.requested_output_names())
            outputs = []
            if "last_hidden_state" in wanted:
                outputs.append(pb_utils.Tensor("last_hidden_state", np.ascontiguousarray(hidden[row:row + n, :length])))
            if "sentence_embedding" in wanted:
                outputs.append(pb_utils.Tensor("sentence_embedding", np.ascontiguousarray(pooled[row:row + n])))
            responses.append(pb_utils.InferenceResponse(outputs))
            row += n
        return responses
