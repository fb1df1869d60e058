"""The coding agents' own programs against the stack: Codex CLI on the Responses API and Claude Code on the
Messages API, run as their users run them (tests/support/agent_clis.py installs the pinned releases from npm),
on the `scripted-agent` test model (tests/triton_models/echo_scripted.py), whose answers follow a script
written in the prompt. Each run takes whole turns: the model calls a tool, the program runs it, its next
request replays the history with the tool's result, and the program prints the model's last answer. The
programs talk to the edge through a recording pass-through (tests/support/recorder.py), so the tests see
exactly what they sent."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from launcher.stack import LocalStack
from tests.support.agent_clis import CLAUDE_CODE, CODEX
from tests.support.recorder import Recorded, recording

MODEL = "scripted-agent"
RUN_TIMEOUT_S = 300
NOTE = "tg-note-4417"
# What Codex needs to know of a model it has no metadata for: its context, and that its `apply_patch` is the
# freeform (custom, Lark grammar) tool, as Codex's own catalog says of OpenAI's models.
CATALOG_ENTRY: dict[str, Any] = {
    "slug": MODEL, "display_name": MODEL, "description": "A deterministic test model.", "visibility": "list",
    "supported_in_api": True, "priority": 1, "context_window": 131072, "max_context_window": 131072,
    "auto_compact_token_limit": None, "apply_patch_tool_type": "freeform", "shell_type": "shell_command",
    "base_instructions": "You are a coding agent. Use the tools to do what the user asks, then answer briefly.",
    "default_reasoning_level": "medium", "supported_reasoning_levels": [{"effort": "medium", "description": "-"}],
    "input_modalities": ["text"], "supports_parallel_tool_calls": True, "supports_reasoning_summaries": False,
    "truncation_policy": {"mode": "tokens", "limit": 10000}, "prefer_websockets": False, "support_verbosity": False,
    "experimental_supported_tools": [],
}


def script(*steps: str) -> str:
    """A prompt the scripted model follows: each step one answer (a tool call, or text)."""
    return "\n".join(["SCRIPT:", *steps])


def call(name: str, arguments: dict[str, Any]) -> str:
    return f"STEP call {name} {json.dumps(arguments)}"


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)


def codex_home(folder: Path, edge_url: str, freeform: bool = False) -> Path:
    """A CODEX_HOME whose config points Codex at `edge_url` with `wire_api = "responses"`."""
    folder.mkdir()
    lines = [f'model = "{MODEL}"', 'model_provider = "tritongate"']
    if freeform:
        (folder / "catalog.json").write_text(json.dumps({"models": [CATALOG_ENTRY]}))
        lines.append(f'model_catalog_json = "{folder / "catalog.json"}"')
    lines += ["[model_providers.tritongate]", 'name = "tritongate"', f'base_url = "{edge_url}/v1"',
              'wire_api = "responses"', 'env_key = "TRITONGATE_API_KEY"']
    (folder / "config.toml").write_text("\n".join(lines) + "\n")
    return folder


def turns(requests: list[Recorded], path: str) -> list[dict[str, Any]]:
    return [r.body for r in requests if r.method == "POST" and r.path.split("?")[0] == path]


def items(body: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [item for item in body["input"] if isinstance(item, dict) and item.get("type") == kind]


def workspace(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "note.txt").write_text(f"{NOTE}\n")
    return work


def test_codex_runs_a_command_then_answers_with_its_output(stack: LocalStack, tmp_path: Path) -> None:
    program = CODEX.program()
    work = workspace(tmp_path)
    prompt = script(call("exec_command", {"cmd": "cat note.txt"}), "STEP say The note says {result}")
    with recording(stack.edge_url) as (url, requests):
        env = {"CODEX_HOME": str(codex_home(tmp_path / "codex", url)), "TRITONGATE_API_KEY": "unused"}
        done = run([str(program), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                    prompt], work, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "The note says" in done.stdout and NOTE in done.stdout, done.stdout[-2000:]
    first, second, *_ = turns(requests, "/v1/responses")
    assert {"function", "namespace", "web_search"} <= {tool["type"] for tool in first["tools"]}
    assert first["stream"] is True and first["store"] is False
    assert first["include"] == ["reasoning.encrypted_content"]
    made = items(second, "function_call")[-1]
    assert made["name"] == "exec_command" and json.loads(made["arguments"]) == {"cmd": "cat note.txt"}
    result = items(second, "function_call_output")[-1]
    assert result["call_id"] == made["call_id"] and NOTE in json.dumps(result["output"])


def test_codex_edits_a_file_with_its_freeform_apply_patch(stack: LocalStack, tmp_path: Path) -> None:
    program = CODEX.program()
    work = workspace(tmp_path)
    patch = "*** Begin Patch\n*** Add File: hello.txt\n+hello from the script\n*** End Patch\n"
    prompt = script(call("apply_patch", {"input": patch}), "STEP say Patched: {result}")
    with recording(stack.edge_url) as (url, requests):
        env = {"CODEX_HOME": str(codex_home(tmp_path / "codex", url, freeform=True)),
               "TRITONGATE_API_KEY": "unused"}
        done = run([str(program), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                    prompt], work, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (work / "hello.txt").read_text() == "hello from the script\n"
    assert "Patched:" in done.stdout, done.stdout[-2000:]
    first, second, *_ = turns(requests, "/v1/responses")
    tool = next(tool for tool in first["tools"] if tool.get("name") == "apply_patch")
    assert tool["type"] == "custom" and tool["format"]["syntax"] == "lark"
    made = items(second, "custom_tool_call")[-1]
    assert made["name"] == "apply_patch" and made["input"] == patch
    assert items(second, "custom_tool_call_output")[-1]["call_id"] == made["call_id"]


def claude_env(home: Path, edge_url: str) -> dict[str, str]:
    home.mkdir()
    return {"HOME": str(home), "ANTHROPIC_BASE_URL": edge_url, "ANTHROPIC_API_KEY": "unused",
            "ANTHROPIC_MODEL": MODEL, "ANTHROPIC_SMALL_FAST_MODEL": MODEL, "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}


def test_claude_code_runs_bash_then_answers_with_its_output(stack: LocalStack, tmp_path: Path) -> None:
    program = CLAUDE_CODE.program()
    work = workspace(tmp_path)
    prompt = script(call("Bash", {"command": "cat note.txt", "description": "Read the note"}),
                    "STEP say The note says {result}")
    with recording(stack.edge_url) as (url, requests):
        done = run([str(program), "-p", prompt, "--model", MODEL, "--allowedTools", "Bash"], work,
                   claude_env(tmp_path / "home", url))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "The note says" in done.stdout and NOTE in done.stdout, done.stdout[-2000:]
    asked = [r for r in requests if r.method == "POST" and r.path.startswith("/v1/messages")]
    assert all(r.path == "/v1/messages?beta=true" and r.headers.get("anthropic-beta") for r in asked)
    first, second = turns(requests, "/v1/messages")[:2]
    assert first["max_tokens"] >= 32000 and first["thinking"]["type"] == "adaptive"
    assert any(turn["role"] == "system" for turn in first["messages"])
    replayed = second["messages"]
    used = next(block for turn in replayed if turn["role"] == "assistant" for block in turn["content"]
                if isinstance(block, dict) and block.get("type") == "tool_use")
    assert used["name"] == "Bash" and used["input"]["command"] == "cat note.txt"
    answered = next(block for turn in replayed if turn["role"] == "user" and isinstance(turn["content"], list)
                    for block in turn["content"] if block.get("type") == "tool_result")
    assert answered["tool_use_id"] == used["id"] and NOTE in json.dumps(answered["content"])
