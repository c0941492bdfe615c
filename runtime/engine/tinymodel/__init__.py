"""A tiny scripted model: a real Qwen3 checkpoint, written in a second, whose replies are known texts.

The tests and the cpu demo need a model that vLLM really serves (no weights can be downloaded here)
and that answers exactly what they expect. The chat template ends the prompt with a *mode token*,
chosen from the LAST user message's text (a string or text blocks) and the template variables:

- no marker: reasoning `THINKING`, then the answer `ANSWER`;
- `MARK_TEXT`, or `enable_thinking` false: `ANSWER` alone;
- `MARK_TOOL`, when tools are given: a hermes tool call of `TOOL_NAME` with `TOOL_ARGUMENTS`;
- `MARK_AGENT`, when tools are given: a call of Claude Code's `AGENT_TOOL`, whose subagent is asked
  `script.AGENT_PROMPT` (it answers `ANSWER`), in the foreground;
- `MARK_WRITE`, when tools are given: a call of Claude Code's `WRITE_TOOL` with `WRITE_ARGUMENTS`, whose
  content elides the file (`WRITE_MARKER`): what the bridge's guard holds back;
- the last message but system ones is a tool result: `AFTER_TOOL`;
- `MARK_LONG`: `LONG_CYCLE` over and over, until `max_tokens`;
- `MARK_PONDER` (thinking on): reasoning `PONDER_CYCLE` over and over, until vLLM's
  `thinking_token_budget` forces `</think>`; `ANSWER` follows. vLLM counts the mode token, which
  follows `<think>` in the prompt, as the first token of thought: a budget of n gives n - 1.

A tool result wins over the markers, then `MARK_TOOL`, `MARK_AGENT`, `MARK_WRITE`, `MARK_LONG`, `MARK_PONDER`, `MARK_TEXT`. A
prompt without a mode token (a raw `/v1/completions` one) is answered with `ANSWER`. Serve it with
`--reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser hermes`.

The package: the script (`script`: replies, mode tokens, successors; `template`: the chat template), standard
library only, apart from the checkpoint's writer (`checkpoint`, `tokenizer`, `weights`: tokenizers and torch).
How the weights follow the script: see `weights`. At image build it runs with no other module of the runtime.
"""

from __future__ import annotations

from pathlib import Path

from runtime.engine.tinymodel.script import (
    AFTER_TOOL,
    AGENT_TOOL,
    ANSWER,
    ANSWER_PIECES,
    LONG_CYCLE,
    LONG_PIECES,
    MARK_AGENT,
    MARK_LONG,
    MARK_PONDER,
    MARK_TEXT,
    MARK_TOOL,
    MARK_WRITE,
    MODE_TOKENS,
    OTHER_ANSWER,
    PONDER_CYCLE,
    PONDER_PIECES,
    SERVED_NAME,
    THINK_START,
    THINKING,
    TOOL_ARGUMENTS,
    TOOL_COMMAND,
    TOOL_NAME,
    WRITE_ARGUMENTS,
    WRITE_MARKER,
    WRITE_TOOL,
    mode_token,
)

# The script's texts, re-exported: what the tests and the demo expect of the model.
__all__ = [
    "AFTER_TOOL",
    "AGENT_TOOL",
    "ANSWER",
    "ANSWER_PIECES",
    "LONG_CYCLE",
    "LONG_PIECES",
    "MARK_AGENT",
    "MARK_LONG",
    "MARK_PONDER",
    "MARK_TEXT",
    "MARK_TOOL",
    "MARK_WRITE",
    "MODE_TOKENS",
    "OTHER_ANSWER",
    "PONDER_CYCLE",
    "PONDER_PIECES",
    "SERVED_NAME",
    "THINKING",
    "THINK_START",
    "TOOL_ARGUMENTS",
    "TOOL_COMMAND",
    "TOOL_NAME",
    "WRITE_ARGUMENTS",
    "WRITE_MARKER",
    "WRITE_TOOL",
    "mode_token",
    "write_tiny_model",
]


def write_tiny_model(directory: Path, answer: str = "hello") -> Path:
    """Write the tiny model, whose plain reply `answer` names (script.ANSWERS), into `directory` and return it. The
    writer is imported on call: importing the script's texts never loads torch or tokenizers."""
    from runtime.engine.tinymodel.checkpoint import write_checkpoint

    return write_checkpoint(directory, answer)
