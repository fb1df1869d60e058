"""scripted-agent: a deterministic agent model on the vLLM backend's Triton interface (echo_vllm.py: the same
inputs, outputs, streaming, stop strings and errors), whose answer follows a script written in the
conversation itself, so that a test drives a real agent client (Codex CLI, Claude Code) through whole turns.

The script is the text after the last `SCRIPT:` in the prompt: one `STEP` line per answer,
- `STEP call NAME {JSON arguments}`: a tool call in the Hermes format the llm service parses
  (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`);
- `STEP say TEXT`: a plain answer, where `{result}` stands for the last tool result (its text on one line);
- `STEP think TEXT`: thinking (`<think>TEXT</think>`) before the next step's answer.
Answer k (k: the tool results after the script, `<tool_response>` blocks as the llm service writes them for
templates without tools) is the k-th call or say step; after the last step the last say step is repeated.
A prompt without a script gets a line saying how to write one. The context is as long as the
`max_model_len` parameter (agents send 10,000 to 50,000 tokens); each answer then ends with the end token.
"""

from __future__ import annotations

import json
import re
from typing import Any

from echo_core import Echo, Job
from echo_vllm import VllmEchoModel

SCRIPT = "SCRIPT:"
STEP = re.compile(r"^STEP (call|say|think) (.*)$", re.MULTILINE)
RESULT = re.compile(r"<tool_response>\s*(.*?)\s*</tool_response>", re.DOTALL)
NO_SCRIPT = "No script: write SCRIPT: and then STEP call NAME {arguments}, STEP say TEXT or STEP think TEXT lines."


def answers(script: str) -> list[str]:
    """Each answer of a script, in order (thinking joined to the answer after it)."""
    found, thought = [], ""
    for kind, text in STEP.findall(script):
        if kind == "think":
            thought += f"<think>\n{text}\n</think>\n\n"
        elif kind == "call":
            name, _, arguments = text.partition(" ")
            call = {"name": name, "arguments": json.loads(arguments or "{}")}
            found.append(f"{thought}<tool_call>\n{json.dumps(call)}\n</tool_call>")
            thought = ""
        else:
            found.append(thought + text)
            thought = ""
    return found


def answer(prompt: str) -> str:
    """The answer the script in `prompt` gives now."""
    at = prompt.rfind(SCRIPT)
    if at < 0:
        return NO_SCRIPT
    script = prompt[at:]
    steps = answers(script)
    if not steps:
        return NO_SCRIPT
    results = RESULT.findall(script)
    step = steps[len(results)] if len(results) < len(steps) else \
        next((s for s in reversed(steps) if "<tool_call>" not in s), steps[-1])
    last = " ".join(results[-1].split()) if results else ""
    return step.replace("{result}", last[:2000])


class ScriptedAgentModel(VllmEchoModel):
    def parse(self, request: Any) -> Job:
        job = super().parse(request)  # the interface's checks, the prompt's length against max_model_len
        text = job.prompt  # type: ignore[attr-defined]
        ids = [*self.tokenizer.encode(answer(text)), self.tokenizer.eos_id]
        first = job.sequences[0]
        job.sequences = [Echo(prompt=ids, max_new=min(first.max_new, len(ids)), end_ids=first.end_ids,
                              min_tokens=first.min_tokens) for _ in job.sequences]
        job.__post_init__()  # type: ignore[misc]
        return job
