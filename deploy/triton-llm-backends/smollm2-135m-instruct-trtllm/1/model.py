import os, site, sys  # noqa: E401, I001  (must come first; see below)

_site = os.environ.get("TRITONGATE_SITE_PACKAGES")
if _site:  # the Python-backend stub runs the base interpreter: the venv's packages first, and its .pth
    sys.path.insert(0, _site)  # files (an editable install of tritongate) through site.addsitedir
    site.addsitedir(_site)

"""SmolLM2-135M-Instruct behind the tensor interface of TensorRT-LLM's C++ `tensorrt_llm` model.

This file only moves tensors: the request semantics (batch items, streaming deltas, the end id, word
lists, which outputs appear) are tritongate/demo_models/llm_trtllm.py, the generation is the engine all
demo LLMs share (llm_core). Requests with `stop` = true stop the running request with the same request
id, as the C++ backend's `handleStopRequest` does.
"""

import json
import threading

import triton_python_backend_utils as pb_utils

from tritongate.demo_models.llm_core import RequestError, load_engine
from tritongate.demo_models.llm_trtllm import Inputs, TrtllmRequest, parse_items, refusal

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
REQUIRED_OUTPUTS = ("output_ids", "sequence_length")


class Request(TrtllmRequest):
    """One Triton request: its generations' responses, sent through its response sender."""

    def __init__(self, model, request, items, **options):
        super().__init__(items, cancelled=request.is_cancelled, **options)
        self.model, self.request, self.sender = model, request, request.get_response_sender()

    def emit(self, seq, outputs, ended, last):
        tensors = [pb_utils.Tensor(name, value) for name, value in outputs.items()]
        self.sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=FINAL if last else 0)
        if last:
            self.model.forget(self)

    def emit_error(self, message):
        self.sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)
        self.model.forget(self)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(f"{args['model_name']} must be decoupled")
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.exclude_input = params.get("exclude_input_in_output", "false").lower() in ("true", "1", "yes")
        self.max_beam_width = int(params.get("max_beam_width") or 1)
        try:
            self.engine = load_engine(args["model_name"], params, pb_utils.Logger.log_info, args)
        except (RuntimeError, ValueError) as exc:  # no weights, or an unusable device or dtype
            raise pb_utils.TritonModelException(f"{args['model_name']}: {exc}") from exc
        self.active = {}  # Triton request id -> its running requests, for `stop`
        self.lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            if self._stop(request):
                continue
            try:
                owner = self._parse(request)
            except RequestError as exc:  # refused before generating, in the words of TensorRT-LLM's checks
                # (INVALID_ARG, which a stream does not carry: the llm service tells a refusal by those words there)
                error = pb_utils.TritonError(refusal(str(exc)), pb_utils.TritonError.INVALID_ARG)
                request.get_response_sender().send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            if owner.request_id:
                with self.lock:
                    self.active.setdefault(owner.request_id, []).append(owner)
            self.engine.submit(owner.seqs)
        return None

    def finalize(self):
        self.engine.close()

    def forget(self, owner):
        with self.lock:
            running = self.active.get(owner.request_id, [])
            if owner in running:
                running.remove(owner)
            if not running:
                self.active.pop(owner.request_id, None)

    def _stop(self, request):
        """A `stop` request: stop the running ones with its request id; answer with an empty response."""
        stop = pb_utils.get_input_tensor_by_name(request, "stop")
        if stop is None or not bool(stop.as_numpy().reshape(-1)[0]):
            return False
        error = None
        if not request.request_id():
            error = pb_utils.TritonError("Trying to stop a request but request ID is not provided")
        else:
            with self.lock:
                for owner in self.active.get(request.request_id(), []):
                    owner.stop_requested = True
        request.get_response_sender().send(pb_utils.InferenceResponse(output_tensors=[], error=error), flags=FINAL)
        return True

    def _parse(self, request):
        requested = request.requested_output_names() or REQUIRED_OUTPUTS
        missing = [name for name in REQUIRED_OUTPUTS if name not in requested]
        if missing:
            raise RequestError(f"{missing[0]} tensor must be present in list of output tensors")
        tensor = pb_utils.get_input_tensor_by_name(request, "input_ids")
        if tensor is None:
            raise RequestError("inputTokens or encoderInputFeatures tensor not provided")
        ids = tensor.as_numpy()
        ids = ids.reshape(1, -1) if ids.ndim == 1 else ids

        def get(name):
            found = pb_utils.get_input_tensor_by_name(request, name)
            return None if found is None else found.as_numpy()

        inputs = Inputs(get, ids.shape[0])
        if ids.shape[0] == 1:  # as the C++ backend: the whole row, input_lengths unread
            prompts = [[int(t) for t in ids[0]]]
        else:
            prompts = [[int(t) for t in ids[i, : inputs.scalar("input_lengths", i, ids.shape[1], int)]]
                       for i in range(ids.shape[0])]
        items = parse_items(inputs, prompts, end_id=None, exclude_input=self.exclude_input,
                            vocab_size=self.engine.vocab_size, max_positions=self.engine.max_positions,
                            compile_guide=self.engine.compile_guide, max_beam_width=self.max_beam_width)
        return Request(
            self, request, items, streaming=bool(inputs.scalar("streaming", 0, False, bool)),
            request_id=request.request_id(),
            return_num_input_tokens=bool(inputs.scalar("return_num_input_tokens", 0, False, bool)),
            return_num_output_tokens=bool(inputs.scalar("return_num_output_tokens", 0, False, bool)),
        )

