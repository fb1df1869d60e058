"""The model configuration file: the `model_config.json` of Denglin's openai_api, accepted unchanged, plus
optional fields.

The Denglin format has four sections: `model_infos` (generation defaults per LLM), `llm`, `embedding`
and `rerank`. Every service reads the same file and takes only its own section. Fields tritongate adds
are optional with defaults; docs/configuration.md documents all of them.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tritongate.batching import SERVICE_SLOTS
from tritongate.triton_address import (
    TRITON_GRPC_PORT,
    TRITON_HTTP_PORT,
    TritonAddress,
    TritonAddresses,
    TritonAddressList,
    address_list,
    parse_triton_address,
    without_scheme,
)
from tritongate.wire import DEFAULT_MAX_N, MAX_N

log = logging.getLogger(__name__)


class ConfigError(Exception):
    """The model configuration file is missing or invalid; the message names the JSON path."""


class _Section(BaseModel):
    # Unknown keys are reported (see load_model_config) but not fatal: real files of Denglin's openai_api
    # carry vendor keys we do not use.
    model_config = ConfigDict(extra="allow", populate_by_name=True, protected_namespaces=())


def _is_offset_row(row: Sequence[int], ids: int) -> bool:
    ends = [value for value in row if value >= 0]
    return (bool(ends) and list(row) == ends + [-1] * (len(row) - len(ends))
            and ends == sorted(ends) and ends[0] > 0 and ends[-1] <= ids)


def token_words(value: Sequence[Sequence[int]]) -> list[list[int]]:
    """`bad_words` / `stop_words` as Denglin's openai_api writes them, as a list of words (each a list of
    token ids). Two layouts are accepted: FasterTransformer's two rows (all words' ids, then each word's
    end offset padded with -1), as in Denglin's example, when the second row reads as offsets into the
    first; anything else is already a list of words (empty ones dropped)."""
    if len(value) == 2 and _is_offset_row(value[1], len(value[0])):
        ids, words, start = value[0], [], 0
        for end in value[1]:
            if end < 0:
                break
            if end > start:
                words.append(list(ids[start:end]))
            start = end
        return words
    return [list(word) for word in value if word]


# A word list of `model_infos`, read once here so that every reader gets a plain list of words.
TokenWords = Annotated[list[list[int]], BeforeValidator(lambda value: [] if value is None else value),
                       AfterValidator(token_words)]


class ModelInfo(_Section):
    """Generation defaults for one LLM (Denglin: `model_infos[]`)."""

    name: str
    start_id: int | None = None
    end_id: int | None = None
    max_len: Annotated[int, Field(gt=0)] | None = None
    bad_words: TokenWords = Field(default_factory=list)
    stop_words: TokenWords = Field(default_factory=list)
    temperature: Annotated[float, Field(ge=0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    mask_positions: int | None = None
    # Extensions.
    max_completion_tokens: Annotated[int, Field(gt=0)] | None = Field(
        None, description="`max_tokens` of a request that sets none; default: the rest of the context"
    )


class TritonModelEntry(_Section):
    """Fields every model entry shares."""

    name: Annotated[str, Field(min_length=1)]
    url: TritonAddresses
    path: Annotated[str, Field(min_length=1)]
    # Extensions.
    triton_model: str | None = Field(None, description="Model name inside Triton; default: `name`.")
    grpc_url: TritonAddressList | None = Field(
        None, description="Triton's gRPC address, or several (a list, or separated by commas); `dns:///host:port` for "
        "every address a DNS name resolves to; default: `url`'s")

    @field_validator("url")
    @classmethod
    def _strip_scheme(cls, value: str) -> str:
        return ",".join(without_scheme(item) for item in address_list(value))

    @property
    def triton_name(self) -> str:
        return self.triton_model or self.name

    @property
    def triton_addresses(self) -> list[TritonAddress]:
        """Where to reach Triton over gRPC: one or more endpoints, the model served by those that have it
        ready (services/common/triton_pool.py).

        Denglin's openai_api points embedding and rerank models at Triton's HTTP port; tritongate speaks
        gRPC, so the default HTTP port 8000 in `url` becomes the default gRPC port 8001 unless `grpc_url`
        says otherwise.
        """
        if self.grpc_url:
            return [parse_triton_address(item) for item in address_list(self.grpc_url)]
        addresses = [parse_triton_address(item) for item in address_list(self.url)]
        return [TritonAddress(a.host, TRITON_GRPC_PORT, a.dns) if a.port == TRITON_HTTP_PORT else a
                for a in addresses]

    @property
    def triton_grpc_url(self) -> str:
        """The Triton addresses in one line, for messages."""
        return ",".join(str(address) for address in self.triton_addresses)


class LoraAdapter(_Section):
    """A LoRA adapter served over an LLM (`llm[].lora_adapters`, by public id): each backend reads its own
    fields (`{}` is a vLLM adapter named as its id)."""

    path: str | None = Field(
        None, description="tensorrt_llm / tensorrt_llm_text: the folder of `model.lora_weights.npy` and "
        "`model.lora_config.npy` (TensorRT-LLM's hf_lora_convert.py output), sent the first time; none: the "
        "backend has the adapter already (its `lora_prefetch_dir`)")
    task_id: Annotated[int, Field(gt=0, lt=2**64)] | None = Field(
        None, description="tensorrt_llm / tensorrt_llm_text: the adapter's `lora_task_id`; default: derived from "
        "`path`")
    lora_name: str | None = Field(None, description="vllm: the adapter's name in the backend's `multi_lora.json`; "
                                  "default: the adapter's id")



class LlmModel(TritonModelEntry):
    """A chat/completions model (Denglin: `llm[]`)."""

    chat_template: str | None = None
    backend: Literal["fastertransformer", "tensorrt_llm", "tensorrt_llm_text", "vllm"] | None = Field(
        None, description="The Triton model's LLM interface; default: detected from its Triton configuration"
    )
    # Extensions.
    accumulate_tokens: bool | None = Field(
        None, description="tensorrt_llm_text: the BLS model sends the whole text so far on each response; "
        "default: its `accumulate_tokens` parameter"
    )
    lora_name: str | None = Field(None, description="vllm: the LoRA adapter every request of this model uses")
    lora_adapters: dict[Annotated[str, Field(min_length=1)], LoraAdapter] = Field(
        default_factory=dict, description="LoRA adapters over this model, by public model id")
    lora_separator: Annotated[str, Field(min_length=1)] | None = Field(
        None, description="Also serve each adapter as `<name><separator><adapter>` (Triton's OpenAI frontend)")
    tool_parser: Literal["hermes", "llama3_json", "mistral"] | None = Field(
        None, description="How the model writes tool calls; default: detected from its chat template (Hermes when "
        "the template shows no tool markup)"
    )
    reasoning_parser: Literal["deepseek_r1", "qwen3", "gpt_oss", "none"] | None = Field(
        None, description="How the model writes its thinking (split into `reasoning_content`); \"none\": not "
        "split; default: detected from its chat template (none when the template shows no thinking markup)"
    )
    triton_inputs: dict[str, float] = Field(
        default_factory=dict,
        description="Constant scalar inputs added to every Triton request (e.g. FT's `len_penalty`), by "
        "tensor name; the data type comes from the Triton model's configuration",
    )
    # The edge bounds `n` by MAX_N for every model; this is the model's own, lower bound.
    max_n: Annotated[int, Field(gt=0, le=MAX_N)] = Field(
        DEFAULT_MAX_N, description="Largest `n` (completions per prompt)"
    )
    max_choices: Annotated[int, Field(gt=0)] = Field(
        64, description="Most completions one request may ask for: prompts times `n`"
    )
    max_completion_tokens: Annotated[int, Field(gt=0)] | None = Field(
        None, description="Most tokens one completion may generate (`max_tokens`); default: the rest of the context"
    )
    stream_interval_ms: Annotated[float, Field(ge=0, le=1000)] = Field(
        1.0, description="Least time between two streamed messages of one request: the tokens generated in between "
        "go out together (as vLLM's and SGLang's `stream_interval`, in time). The first token does not wait for it. "
        "Raise it for a fast model on a GPU server (e.g. 20-50) to cut the gateway's CPU per token; 0: a message as "
        "soon as the service is free"
    )
    hosted_tools: Literal["ignore", "refuse"] = Field(
        "ignore", description="A request that names hosted tools (a web search, a code interpreter, ...), which "
        "cannot run here: \"ignore\" serves it without offering them to the model; \"refuse\" answers 400 naming "
        "the first one"
    )
    tokens_per_block: Annotated[int, Field(gt=0)] = Field(
        64, description="tensorrt_llm / tensorrt_llm_text: tokens per block of the engine's paged KV cache (its "
        "build setting `--tokens_per_block`), which turns the blocks the backend reports reusing into cached tokens"
    )
    # Beam search.
    max_beams: Annotated[int, Field(ge=0)] | None = Field(
        None, description="Most beams of beam search (`num_beams`), below what the backend takes; 0 or 1: no beam "
        "search; default: the backend's (FasterTransformer: 32; TensorRT-LLM: the Triton model's `max_beam_width`)"
    )

    def adapter_ids(self) -> dict[str, str]:
        """Every model id that names one of the adapters → the adapter: its own id and, with a separator,
        `<name><separator><adapter>`."""
        ids = {adapter: adapter for adapter in self.lora_adapters}
        if self.lora_separator:
            ids.update({f"{self.name}{self.lora_separator}{adapter}": adapter for adapter in self.lora_adapters})
        return ids


Pooling = Literal["auto", "cls", "mean", "none"]


class EncoderEntry(TritonModelEntry):
    """Fields embedding and rerank models share."""

    max_tokens: Annotated[int, Field(gt=0)] = 512
    input_config: dict[str, str] = Field(default_factory=dict, description="our tensor name → model's")
    truncate: bool = Field(True, description="Cut inputs longer than max_tokens instead of rejecting them")
    max_batch_size: Annotated[int, Field(gt=0)] | None = Field(
        None, description="Rows per Triton request; default: the Triton model's max_batch_size"
    )
    max_concurrent_batches: Annotated[int, Field(gt=0)] = Field(
        SERVICE_SLOTS, description="Triton calls in flight per model while the service is busy; requests "
        "arriving meanwhile are merged (tritongate/batching.py)"
    )


class EmbeddingModel(EncoderEntry):
    """An embedding model (Denglin: `embedding[]`)."""

    pooling: Pooling = Field(
        "auto",
        description="cls | mean | none (the output is already one vector per input) | auto: the model "
        "folder's sentence-transformers pooling config, else cls",
    )
    normalize: bool = True
    output_name: str | None = Field(None, description="Triton output tensor; default: the model's first")
    # Retrieval prompts (NIM's `input_type`, TEI's `prompt_name`).
    prompts: dict[str, str] = Field(
        default_factory=dict,
        description="Text put before an input, by name, as sentence-transformers' `prompts`: `query` and "
        "`passage` serve NIM's `input_type` (e.g. E5: `query: ` and `passage: `), any name TEI's `prompt_name`",
    )
    default_prompt_name: str | None = Field(None, description="The prompt of a request that names none")

    @model_validator(mode="after")
    def _default_prompt(self) -> Self:
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise ValueError(f"model `{self.name}`: `default_prompt_name` {self.default_prompt_name!r} is not one "
                             "of its `prompts`")
        return self


class RerankOutput(_Section):
    name: str = "logits"
    process: Literal["normalize", "none", "softmax"] = "normalize"


class RerankModel(EncoderEntry):
    """A rerank (cross-encoder) model (Denglin: `rerank[]`)."""

    output_config: RerankOutput = Field(default_factory=RerankOutput)


class ModelConfig(_Section):
    """The whole file."""

    model_infos: list[ModelInfo] = Field(default_factory=list)
    llm: list[LlmModel] = Field(default_factory=list)
    embedding: list[EmbeddingModel] = Field(default_factory=list)
    rerank: list[RerankModel] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> ModelConfig:
        seen: dict[str, str] = {}
        for section in ("llm", "embedding", "rerank"):
            for i, entry in enumerate(getattr(self, section)):
                if entry.name in seen:
                    raise ValueError(
                        f"$.{section}[{i}].name: model id {entry.name!r} is already used at {seen[entry.name]}"
                    )
                seen[entry.name] = f"$.{section}[{i}].name"
        for i, llm in enumerate(self.llm):  # adapters are models too: their ids may clash with no other
            for model_id, adapter in llm.adapter_ids().items():
                if model_id in seen:
                    raise ValueError(f"$.llm[{i}].lora_adapters.{adapter}: model id {model_id!r} is already used "
                                     f"at {seen[model_id]}")
                seen[model_id] = f"$.llm[{i}].lora_adapters.{adapter}"
        return self

    def model_info(self, name: str) -> ModelInfo:
        """The generation defaults for an LLM (empty defaults when the file has none)."""
        return next((m for m in self.model_infos if m.name == name), ModelInfo(name=name))


def _json_path(loc: tuple[int | str, ...]) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


def _unknown_keys(model: BaseModel, path: str) -> list[str]:
    found = [f"{path}.{key}" for key in (model.model_extra or {})]
    for field in type(model).model_fields:
        value = getattr(model, field)
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if isinstance(item, BaseModel):
                sub = f"{path}.{field}[{i}]" if isinstance(value, list) else f"{path}.{field}"
                found += _unknown_keys(item, sub)
    return found


def parse_model_config(data: Any, source: str = "<config>") -> ModelConfig:
    """Validate parsed JSON; raise ConfigError naming the JSON path and what was expected."""
    try:
        config = ModelConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            if err["type"] == "value_error" and str(err["msg"]).startswith("Value error, $"):
                problems.append(str(err["msg"]).removeprefix("Value error, "))
                continue
            got = f" (got {err['input']!r})" if err["type"] != "missing" else ""
            problems.append(f"{_json_path(err['loc'])}: {err['msg']}{got}")
        raise ConfigError(f"{source}: " + "; ".join(problems)) from None
    for key in _unknown_keys(config, "$"):
        log.warning("%s: ignoring unknown key %s", source, key)
    return config


def load_model_config(path: str | os.PathLike[str]) -> ModelConfig:
    """Read, validate and resolve the model configuration file."""
    file = Path(path).expanduser()
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{file}: model configuration file not found") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{file}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    config = parse_model_config(data, str(file))
    _resolve_paths(config, file.parent)
    return config


def expand_path(value: str, base: Path) -> str:
    """Expand `~` and `$VARS` (TRITONGATE_MODELS_DIR defaults to the model cache) and make relative
    paths relative to the configuration file's folder."""
    from tritongate.settings import default_models_dir

    env = {"TRITONGATE_MODELS_DIR": str(default_models_dir()), **os.environ}
    expanded = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m[1] or m[2], m[0]), value)
    resolved = Path(expanded).expanduser()
    return str(resolved if resolved.is_absolute() else (base / resolved).resolve())


def _resolve_paths(config: ModelConfig, base: Path) -> None:
    entries: list[TritonModelEntry] = [*config.llm, *config.embedding, *config.rerank]
    for entry in entries:
        entry.path = expand_path(entry.path, base)
    for llm in config.llm:
        for adapter in llm.lora_adapters.values():
            if adapter.path:
                adapter.path = expand_path(adapter.path, base)
        if llm.chat_template:
            # Denglin's openai_api names the template file relative to the config file; else the model folder.
            candidate = Path(expand_path(llm.chat_template, base))
            if not candidate.exists():
                candidate = Path(llm.path) / llm.chat_template
            llm.chat_template = str(candidate)
