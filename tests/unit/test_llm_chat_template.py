"""Chat templates render as transformers renders them, inside a sandbox, with template errors as
INVALID_ARGUMENT naming `messages`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from services.common.errors import ServiceError
from services.llm.chat import ChatTemplate, load_chat_template
from tritongate.config import ConfigError

SMOLLM2 = "smollm2-135m-instruct"
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "北京? 😀"}],
]



@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_the_model_folders_template_renders_like_transformers(tokenizer: Any, messages: list[dict[str, str]],
                                                               generation_prompt: bool) -> None:
    template = load_chat_template(tokenizer, None, SMOLLM2)
    assert template is not None
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    assert template.render(messages, add_generation_prompt=generation_prompt) == expected


def test_the_config_file_overrides_the_folder_template(tokenizer: Any, tmp_path: Path) -> None:
    path = tmp_path / "plain.jinja"
    path.write_text("{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                    "{% if add_generation_prompt %}[assistant] {% endif %}")
    template = load_chat_template(tokenizer, str(path), SMOLLM2)
    assert template is not None
    assert template.render(CONVERSATIONS[0]) == "<|im_start|>[user] What is the capital of France?\n[assistant] "
    with pytest.raises(ConfigError, match="cannot read chat_template"):
        load_chat_template(tokenizer, str(tmp_path / "missing.jinja"), SMOLLM2)


def test_raise_exception_is_the_clients_error() -> None:
    template = ChatTemplate("{% for m in messages %}{% if m.role == 'system' %}"
                            "{{ raise_exception('System messages are not supported') }}{% endif %}{% endfor %}",
                            SPECIAL, "test")
    with pytest.raises(ServiceError) as info:
        template.render([{"role": "system", "content": "x"}])
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and info.value.param == "messages"
    assert "System messages are not supported" in info.value.message


@pytest.mark.parametrize("source", [
    "{{ messages.__class__.__mro__ }}",
    "{{ ''.__class__.__subclasses__() }}",
    "{% set ns = namespace(_x=1) %}",
    "{{ messages.append(1) }}",  # immutable sandbox
])
def test_the_sandbox_refuses_escapes(source: str) -> None:
    with pytest.raises(ServiceError) as info:
        ChatTemplate(source, SPECIAL, "test").render([{"role": "user", "content": "x"}])
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_transformers_globals_and_tags() -> None:
    template = ChatTemplate("{% generation %}{{ messages | tojson }}{% endgeneration %}"
                            "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                            "{% if loop.index > 5 %}{% break %}{% endif %}{% endfor %}{{ ns.n }}"
                            "{{ eos_token }}{{ strftime_now('%Y') | length }}", SPECIAL, "test")
    assert template.render([{"role": "user", "content": "é"}]) == '[{"role": "user", "content": "é"}]1</s>4'


def test_a_template_that_does_not_compile_fails_at_start_up() -> None:
    with pytest.raises(ConfigError, match="line 1"):
        ChatTemplate("{% for %}", SPECIAL, "broken.jinja")


def test_chat_template_kwargs_are_template_variables_but_cannot_replace_the_messages() -> None:
    template = ChatTemplate("{% if enable_thinking %}<think>{% endif %}{{ messages[0].content }}"
                            "{% if add_generation_prompt %}>{% endif %}", {}, "test")
    messages = [{"role": "user", "content": "hi"}]
    assert template.render(messages) == "hi>"
    assert template.render(messages, variables={"enable_thinking": True}) == "<think>hi>"
    assert template.render(messages, variables={"messages": [], "add_generation_prompt": False}) == "hi>"


# Modelled on the templates that take one system message, at the start (Qwen's, Llama's).
FIRST_SYSTEM_ONLY = ChatTemplate(
    "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
    "<|{{ m.role }}|>{{ m.content }}\n{% endfor %}", SPECIAL, "test")


def test_late_system_messages_are_joined_to_the_first_when_the_template_refuses_them() -> None:
    late = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "system", "content": "Now in French."},
            {"role": "user", "content": "Again"}, {"role": "system", "content": "No emoji."}]
    assert FIRST_SYSTEM_ONLY.render(late) == ("<|system|>Be brief.\n\nNow in French.\n\nNo emoji.\n<|user|>Hi\n"
                                              "<|assistant|>Hello!\n<|user|>Again\n")
    without_first = [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Be brief."}]
    assert FIRST_SYSTEM_ONLY.render(without_first) == "<|system|>Be brief.\n<|user|>Hi\n"


def test_a_refusal_with_no_late_system_message_or_after_joining_them_stands() -> None:
    no_assistant = ChatTemplate("{% for m in messages %}{% if m.role == 'assistant' %}"
                                "{{ raise_exception('Assistant messages are not supported') }}{% endif %}"
                                "{% if m.role == 'system' and not loop.first %}"
                                "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
                                "{% endfor %}", SPECIAL, "test")
    for messages in ([{"role": "assistant", "content": "x"}],
                     [{"role": "assistant", "content": "x"}, {"role": "system", "content": "late"}]):
        with pytest.raises(ServiceError) as info:
            no_assistant.render(messages)
        assert info.value.param == "messages" and "Assistant messages are not supported" in info.value.message


def test_a_template_that_takes_system_messages_anywhere_gets_them_where_they_stand(tokenizer: Any) -> None:
    template = load_chat_template(tokenizer, None, SMOLLM2)  # SmolLM2's renders every message as it stands
    assert template is not None
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                {"role": "system", "content": "Now in French."}, {"role": "user", "content": "Again"}]
    rendered = template.render(messages)
    assert rendered == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered.index("Hello!") < rendered.index("<|im_start|>system\nNow in French.<|im_end|>")
