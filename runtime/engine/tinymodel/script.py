"""The tiny model's script: its replies cut into pieces (one token each), the mode tokens that pick a reply,
and which token follows which (`Script`). Standard library only: the tests read it without torch."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass

SERVED_NAME = "tiny"

MARK_TEXT = "[text]"
MARK_TOOL = "[tool]"
MARK_LONG = "[long]"
MARK_PONDER = "[ponder]"
MARK_AGENT = "[agent]"
MARK_WRITE = "[write]"

TOOL_NAME = "Bash"
TOOL_COMMAND = "echo tiny-model-was-here > proof.txt"
AGENT_TOOL = "Agent"  # Claude Code's tool that starts a subagent
AGENT_PROMPT = f"Say hello {MARK_TEXT}"
WRITE_TOOL = "Write"  # Claude Code's whole-file write, whose elided content the bridge's guard holds back
WRITE_MARKER = "# ... rest of the file unchanged"
WRITE_ARGUMENTS = {"file_path": "app.py", "content": f"def main() -> None:\n    print('tiny')\n\n\n{WRITE_MARKER}\n"}

# Each reply is cut into pieces, one token each. A piece may sit at one place only, since what
# follows a token is a function of that token (and of the mode, for `</think>` alone). Pieces hold
# a space inside, so none is also a token of the trained BPE vocabulary, which never merges across
# a space; the tool call's pieces are spelt so that hermes streams the arguments exactly.
THINKING_PIECES = ("The user", " wants the", " scripted reply,", " so I", " give it", " now.")
ANSWER_PIECES = ("Hello from", " the tiny", " model.")
OTHER_ANSWER_PIECES = ("Greetings from", " the other", " tiny model.")  # the second model's (recipe tiny2)
AFTER_TOOL_PIECES = ("The command", " ran.")
LONG_PIECES = ("On and", " on the", " tiny model", " keeps talking. ")
PONDER_PIECES = ("Let me", " think about", " it once", " more. ")
TOOL_CALL_PIECES = (
    "<tool_call>",
    f'\n{{"name": "{TOOL_NAME}", "arguments": ',
    json.dumps({"command": TOOL_COMMAND}),
    "}\n",
    "</tool_call>",
)
# Its own first and last pieces: `<tool_call>` and `}\n` already lead to the Bash call's pieces. vLLM's
# hermes parser reads the text, not the token ids, so a longer token holding `<tool_call>` is read alike.
AGENT_ARGUMENTS = {
    "description": "Say hello",
    "prompt": AGENT_PROMPT,
    "subagent_type": "general-purpose",
    "run_in_background": False,
}
AGENT_CALL_PIECES = (
    f'<tool_call>\n{{"name": "{AGENT_TOOL}", "arguments": ',
    json.dumps(AGENT_ARGUMENTS),
    "}\n</tool_call>",
)
# A whole-file write that elides the file, as models write them: it ends as the Agent call does.
WRITE_CALL_PIECES = (
    f'<tool_call>\n{{"name": "{WRITE_TOOL}", "arguments": ',
    json.dumps(WRITE_ARGUMENTS),
    AGENT_CALL_PIECES[-1],
)
PIECES = (
    *THINKING_PIECES,
    *ANSWER_PIECES,
    *OTHER_ANSWER_PIECES,
    *AFTER_TOOL_PIECES,
    *LONG_PIECES,
    *PONDER_PIECES,
    *TOOL_CALL_PIECES,
    *AGENT_CALL_PIECES,
    *WRITE_CALL_PIECES[:-1],
)

THINKING = "".join(THINKING_PIECES)
ANSWER = "".join(ANSWER_PIECES)
OTHER_ANSWER = "".join(OTHER_ANSWER_PIECES)
ANSWERS = {"hello": ANSWER_PIECES, "greetings": OTHER_ANSWER_PIECES}  # a generated model's plain reply, by name
AFTER_TOOL = "".join(AFTER_TOOL_PIECES)
LONG_CYCLE = "".join(LONG_PIECES)
PONDER_CYCLE = "".join(PONDER_PIECES)
TOOL_ARGUMENTS = {"command": TOOL_COMMAND}

THINK_START, THINK_END = "<think>", "</think>"
END_OF_TEXT, TURN_START, TURN_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
EOS = TURN_END

# Replies without reasoning, by mode. With thinking on they open with `</think>` (the qwen3 parser
# reads everything before it as reasoning); with thinking off the parser takes the text verbatim.
REPLIES = {
    "text": ANSWER_PIECES,
    "tool": TOOL_CALL_PIECES,
    "agent": AGENT_CALL_PIECES,
    "write": WRITE_CALL_PIECES,
    "after_tool": AFTER_TOOL_PIECES,
    "long": LONG_PIECES,
}
REASONING_MODES = ("think", "ponder")


def mode_token(mode: str, *, thinking: bool = False) -> str:
    """The prompt's last token in `mode`; `thinking` marks a reply without reasoning, thinking on."""
    return f"<|mode:{mode}{'+think' if thinking else ''}|>"


MODE_TOKENS = (
    *(mode_token(m) for m in REASONING_MODES),
    *(mode_token(m, thinking=t) for m in REPLIES for t in (False, True)),
)


@dataclass(frozen=True)
class Script:
    """What the model emits, by token id: `follows[t]` after t; after `</think>`, `after_think[mode]`."""

    follows: dict[int, int]
    after_think: dict[int, int]
    default: int  # what any unscripted token leads to
    think_end: int

    @classmethod
    def of(cls, ids: Mapping[str, int], answer: tuple[str, ...] = ANSWER_PIECES) -> Script:
        """The script in the token ids of a vocabulary (`ids`: token → id) that holds every piece and mode token;
        `answer`: the pieces of its plain reply (ANSWER_PIECES, or OTHER_ANSWER_PIECES for the second model)."""
        paths = [
            [mode_token("think"), *THINKING_PIECES, THINK_END],
            [mode_token("ponder"), *PONDER_PIECES, PONDER_PIECES[0]],
            [*answer, EOS],
            [*TOOL_CALL_PIECES, EOS],
            [*AGENT_CALL_PIECES, EOS],
            [*WRITE_CALL_PIECES, EOS],
            [*AFTER_TOOL_PIECES, EOS],
            [*LONG_PIECES, LONG_PIECES[0]],
        ]
        after_think = {mode_token(m): answer[0] for m in REASONING_MODES}
        for mode, pieces in {**REPLIES, "text": answer}.items():
            paths += [[mode_token(mode), pieces[0]], [mode_token(mode, thinking=True), THINK_END]]
            after_think |= {mode_token(mode): pieces[0], mode_token(mode, thinking=True): pieces[0]}
        follows: dict[int, int] = {}
        for path in paths:
            for current, following in itertools.pairwise(path):
                if follows.setdefault(ids[current], ids[following]) != ids[following]:
                    raise ValueError(f"{current!r} would lead to two tokens: make the pieces unique")
        return cls(
            follows=follows,
            after_think={ids[m]: ids[t] for m, t in after_think.items()},
            default=ids[answer[0]],
            think_end=ids[THINK_END],
        )
