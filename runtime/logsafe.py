"""Text on its way to a log or a terminal: a client's values escaped and capped, control sequences stripped.

A client chooses its model name, its request id, its prompt. Written raw, a newline forges a log line,
an escape sequence reaches the operator's terminal (OSC 52 writes the clipboard) and a 10 MiB value
fills the disk: every client value in a log line goes through `loggable`, and whatever a log hands to a
terminal or to the Hub goes through `strip_controls`.
"""

from __future__ import annotations

import re

ERROR_CHARS = 300  # of an error's text in one log line: its gist, not a page of HTML a server sent
CLIENT_VALUE_CHARS = 200  # more than any real model name or request id; a 10 MiB one stays a short field
PROMPT_CHARS = 1000  # VL_LOG_PROMPTS: enough of the last user message to recognise it, not a whole document
# A value made only of these is written bare (`model=claude-tiny`): nothing in it can end its field early.
BARE = re.compile(r"[A-Za-z0-9_.:/@+\[\]-]+")
# Every ECMA-48 control a terminal acts on, in that order: control strings (OSC, DCS, SOS, PM, APC, in
# 7- and 8-bit form, ended by BEL or ST, or cut at the end of their line), CSI sequences, the other
# escape sequences (a lone ESC too), then the remaining C0 and C1 controls; tab and newline are text.
# Last, what reorders or breaks a line for its reader without being a control: bidi marks, embeddings,
# overrides and isolates (a line that reads otherwise than it is), and the line and paragraph separators.
CONTROLS = re.compile(
    r"(?:\x1b[]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
    r"|(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
    r"|[\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def loggable(value: str, limit: int = CLIENT_VALUE_CHARS) -> str:
    """`value` as one field of a log line: bare when harmless, else quoted with every non-printable
    character escaped (`repr`: no newline, CR, ESC or other control stays raw); cut after `limit` chars."""
    head = value[:limit]
    shown = head if BARE.fullmatch(head) else repr(head)
    return shown if len(value) <= limit else f"{shown}...(+{len(value) - limit} chars)"


def strip_controls(text: str) -> str:
    """`text` without any terminal control sequence or control character but tab and newline: what is
    published or printed from a log may have been written by anyone (a client, a model, a package)."""
    return CONTROLS.sub("", text)


def terminal_line(text: str, limit: int | None = None) -> str:
    """Words from elsewhere (a server's answer, a model's name) as one line of a terminal: each of their lines
    stripped of controls (a control string ends at its line), then all joined by single spaces; cut at `limit`."""
    line = " ".join(" ".join(strip_controls(part) for part in text.splitlines()).split())
    return line if limit is None else line[:limit]


def one_line(error: BaseException) -> str:
    """An error as one line of a log: its type, then its text with every line break folded, cut at ERROR_CHARS (a
    Hub or a download can fail with a multi-line message, and a log line must stay one line)."""
    text = " ".join(str(error).split())[:ERROR_CHARS]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
