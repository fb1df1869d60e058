"""Chat templates, rendered as transformers' `apply_chat_template` renders them, in a sandbox.

Templates come with model folders (or the `.jinja` file an `llm[]` entry names in `chat_template`, as in
Denglin's openai_api) and are untrusted code: they run in Jinja's ImmutableSandboxedEnvironment with the
globals transformers gives them (`raise_exception`, `strftime_now`, `namespace`, a `tojson` that keeps
non-ASCII text) and the tokenizer's special tokens (`bos_token`, `eos_token`, ...). A template that
raises (e.g. "roles must alternate") is the client's mistake and becomes INVALID_ARGUMENT with the
template's message.

System messages may stand anywhere in a conversation (agents add them after the first turns). They reach
the template where they stand; a template that refuses them there (many allow one system message, at the
start) gets them joined, in order, to the system message that opens the conversation, and renders again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from services.common.errors import ServiceError, invalid_argument
from tritongate.config import ConfigError


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _Namespace(jinja2.utils.Namespace):
    """`namespace()` without underscore attributes (no way to CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's own signature trick: `self` may be a key
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attributes ({name!r})")


class _GenerationTag(Extension):
    """`{% generation %}…{% endgeneration %}` (marks assistant text for training masks): rendered as is."""

    tags = {"generation"}  # noqa: RUF012 (Jinja's own attribute)

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    return env


def _plain(value: Any) -> Any:
    """Only JSON data reaches a template."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return str(value)


def join_late_system(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]] | None:
    """The messages with each system message after the first message joined, in order, to the first (a
    system message of their own at the start when the first is not one); None when there is none to join."""
    late = [m for m in messages[1:] if m.get("role") == "system"]
    if not late:
        return None
    rest = [m for m in messages[1:] if m.get("role") != "system"]
    head = messages[0] if messages[0].get("role") == "system" else None
    parts = [str(m.get("content") or "") for m in ([head] if head else []) + late]
    system = {**(head or {"role": "system"}), "content": "\n\n".join(part for part in parts if part)}
    return [system, *([] if head else [messages[0]]), *rest]


class ChatTemplate:
    """One compiled template with the tokenizer's special tokens."""

    def __init__(self, source: str, special_tokens: Mapping[str, Any], origin: str) -> None:
        self.origin = origin
        self.source = source
        environment = _environment()
        try:
            self.template = environment.from_string(source)
            # Whether the template renders `tools` itself (else the service describes them: services/llm/tools.py).
            self.uses_tools = "tools" in meta.find_undeclared_variables(environment.parse(source))
            # Whether it places images: a multimodal template tests a content part for type 'image' (as
            # Qwen2-VL's, Llama 3.2 Vision's and LLaVA's do); others get a message's text only.
            self.takes_images = bool(re.search(r"""['"]image['"]""", source))
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(f"chat template {origin}: line {exc.lineno}: {exc.message}") from None
        self.special_tokens = {key: value for key, value in special_tokens.items() if isinstance(value, str)}

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               variables: Mapping[str, Any] | None = None, tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """`variables` (the request's `chat_template_kwargs`, e.g. `enable_thinking`) are extra names the
        template sees; they cannot replace the messages, the tools or the generation prompt flag. `tools`
        are OpenAI's tool objects, as transformers' `apply_chat_template(tools=...)` gives them."""
        context = {**self.special_tokens, "documents": None, **_plain(dict(variables or {})),
                   "tools": _plain(list(tools)) if tools else None, "messages": _plain(list(messages)),
                   "add_generation_prompt": add_generation_prompt}
        try:
            return self._render(context)
        except ServiceError:
            joined = join_late_system(messages)
            if joined is None:
                raise
            return self._render({**context, "messages": _plain(joined)})

    def _render(self, context: Mapping[str, Any]) -> str:
        try:
            return self.template.render(**context)
        except jinja2.TemplateError as exc:  # raise_exception, undefined names, sandbox violations
            raise invalid_argument(f"The chat template rejected the messages: {exc.message or exc}",
                                   "messages") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError) as exc:
            raise invalid_argument(f"The chat template failed on these messages: {exc}", "messages") from None


def load_chat_template(tokenizer: Any, override: str | None, model: str) -> ChatTemplate | None:
    """The configuration's `chat_template` file if set, else the model folder's template, else None."""
    special = dict(getattr(tokenizer, "special_tokens_map", {}) or {})
    if override:
        path = Path(override)
        try:
            return ChatTemplate(path.read_text(encoding="utf-8"), special, str(path))
        except OSError as exc:
            raise ConfigError(f"model `{model}`: cannot read chat_template {path}: {exc.strerror}") from None
    source = getattr(tokenizer, "chat_template", None)
    if isinstance(source, dict):  # named templates: the default one
        source = source.get("default")
    if not source:
        return None
    return ChatTemplate(source, special, f"of model `{model}`")
