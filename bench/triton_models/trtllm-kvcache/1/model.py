import os, sys  # noqa: E401, I001  (must come first; see below)

_site = os.environ.get("TRITONGATE_SITE_PACKAGES")
if _site:  # the Python-backend stub runs the base interpreter; use the venv's packages first
    sys.path.insert(0, _site)
sys.dont_write_bytecode = True  # a __pycache__ folder in the model repository would be taken for a model
_ROOT = os.path.realpath(__file__)
for _ in range(5):  # <root>/bench/triton_models/trtllm-kvcache/1/model.py (by its own path: symlinks work)
    _ROOT = os.path.dirname(_ROOT)
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests", "triton_models")]

"""trtllm-kvcache: trtllm-echo (tests/triton_models/echo_tensorrt_llm.py) with a simulated KV cache whose
time to first token grows with the prompt tokens it has not seen recently (bench/kv_cache.py).

Each request's prompt goes through the model instance's `BlockCache` (blocks of the `tokens_per_block`
parameter, at most `kv_cache_blocks` of them, the LoRA task as the salt); with `return_perf_metrics` every
response carries `kv_cache_reused_blocks`, as TensorRT-LLM's does. Before its first token the request
waits for the instance's one prefill engine, then sleeps `prefill_us_per_token` for each prompt token
not reused. The request's events (`$TRITONGATE_TEST_EVENTS`) carry its `prefill_tokens`."""

from typing import Any

from echo_tensorrt_llm import TrtllmEchoModel

from bench.kv_cache import BlockCache, Prefill


class TritonPythonModel(TrtllmEchoModel):
    def setup(self) -> None:
        super().setup()
        self.cache = BlockCache(self.tokens_per_block, int(self.param("kv_cache_blocks", "4096")))
        self.prefill = Prefill(float(self.param("prefill_us_per_token", "25")) / 1e6)
        self.uncached = 0  # the last parsed prompt's tokens to prefill (parse runs on Triton's one thread)

    def reuse(self, prompt: list[int], task: int | None) -> int:
        blocks = self.cache.serve(prompt, task)
        self.uncached = len(prompt) - blocks * self.tokens_per_block
        return blocks

    def common(self, request: Any, prompt: list[int], *args: Any) -> Any:
        job = super().common(request, prompt, *args)
        job.report["prefill_tokens"] = self.uncached
        return job

    def _stream(self, request: Any, sender: Any, job: Any) -> None:
        self.prefill.run(job.report["prefill_tokens"])
        super()._stream(request, sender, job)


__all__ = ["TritonPythonModel"]
