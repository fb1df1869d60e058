"""`tritongate chat`: a console chat with any OpenAI-compatible server (tritongate's edge by default),
like `lmdeploy serve api_client`. The answer streams as it arrives; the conversation is kept until
/reset. Ctrl-C stops the answer being written (closing the stream, which cancels the request on the
server) and returns to the prompt; Ctrl-D or /quit leaves.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import openai

HELP = """commands:
  /reset           forget the conversation (the system message stays)
  /model [NAME]    show the models, or talk to NAME from now on
  /system [TEXT]   set the system message (none without TEXT); the conversation starts again
  /quit            leave (or Ctrl-D); Ctrl-C stops an answer"""


@dataclass
class Conversation:
    model: str
    system: str = ""
    turns: list[dict[str, str]] = field(default_factory=list)

    def messages(self) -> list[dict[str, str]]:
        return [*([{"role": "system", "content": self.system}] if self.system else []), *self.turns]


def default_model(client: openai.OpenAI) -> str:
    """The first model that generates (tritongate marks them `allow_sampling`), else the first listed: the
    server's default LLM, which tritongate lists first (TRITONGATE_DEFAULT_LLM, docs/configuration.md)."""
    models = list(client.models.list())
    if not models:
        raise SystemExit("tritongate chat: the server lists no models")
    for model in models:
        permission = (getattr(model, "permission", None) or [{}])[0]
        if permission.get("allow_sampling"):
            return model.id
    return models[0].id


def answer(client: openai.OpenAI, conversation: Conversation, options: dict[str, Any], out: Any) -> None:
    """Stream one answer to `out`; keep the exchange unless Ctrl-C stopped it."""
    messages: Any = conversation.messages()
    parts: list[str] = []
    usage = None
    stream = None
    try:
        stream = client.chat.completions.create(model=conversation.model, messages=messages, stream=True,
                                                stream_options={"include_usage": True}, **options)
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text = choice.delta.content or ""
                parts.append(text)
                out.write(text)
                out.flush()
    except KeyboardInterrupt:
        if stream is not None:
            stream.close()  # the server sees the connection go and cancels the request
        conversation.turns.pop()  # the question goes too: the conversation stays as it was
        out.write("\n[cancelled]\n")
        return
    conversation.turns.append({"role": "assistant", "content": "".join(parts)})
    counts = f" [{usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens]" if usage else ""
    out.write(f"\n{counts.strip()}\n" if counts else "\n")


def command(line: str, client: openai.OpenAI, conversation: Conversation, out: Any) -> bool:
    """Run a /command; False to leave."""
    name, _, rest = line.partition(" ")
    rest = rest.strip()
    if name in ("/quit", "/exit"):
        return False
    if name == "/reset":
        conversation.turns.clear()
        out.write("[conversation reset]\n")
    elif name == "/model":
        if rest:
            conversation.model = rest
            out.write(f"[model: {rest}]\n")
        else:
            names = [m.id for m in client.models.list()]
            out.write("".join(f"{'*' if n == conversation.model else ' '} {n}\n" for n in names))
    elif name == "/system":
        conversation.system = rest
        conversation.turns.clear()
        out.write(f"[system: {rest}]\n" if rest else "[no system message]\n")
    else:
        out.write(HELP + "\n")
    return True


def run_chat(url: str, api_key: str, model: str | None, system: str, options: dict[str, Any]) -> None:
    import openai

    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    # Ctrl-C stops an answer even when the console was started with SIGINT ignored (a shell's background
    # job inherits that, and Python then never turns Ctrl-C into KeyboardInterrupt).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    client = openai.OpenAI(base_url=url, api_key=api_key, max_retries=0)
    out = sys.stdout
    try:
        conversation = Conversation(model or default_model(client), system)
    except openai.APIError as exc:
        raise SystemExit(f"tritongate chat: {url}: {exc}") from None
    except openai.APIConnectionError as exc:
        raise SystemExit(f"tritongate chat: cannot reach {url}: {exc}") from None
    out.write(f"tritongate chat with {conversation.model} at {url} (/help for commands)\n")
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            out.write("\n")
            return
        except KeyboardInterrupt:
            out.write("\n(Ctrl-D or /quit to leave)\n")
            continue
        if not line:
            continue
        if line.startswith("/"):
            if not command(line, client, conversation, out):
                return
            continue
        conversation.turns.append({"role": "user", "content": line})
        try:
            answer(client, conversation, options, out)
        except openai.APIError as exc:  # the server refused or failed: say so, keep going
            conversation.turns.pop()
            out.write(f"\n[error: {exc}]\n")
        except openai.APIConnectionError as exc:
            conversation.turns.pop()
            out.write(f"\n[cannot reach {url}: {exc}]\n")
