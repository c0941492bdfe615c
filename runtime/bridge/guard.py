"""The guard against truncated whole-file writes (VL_GUARD): which tool calls would overwrite a file with
an elided copy of it, and the text block that the client gets in their place.

A model sometimes rewrites a whole file with a placeholder where code was ("# ... rest of file
unchanged"): the tool writes exactly that, and the rest of the user's file is gone without a word. The
field notes' first guard also looked at edits and at a bare `[...]`, `# ...` or `...`, and blocked sound
writes in real sessions (a markdown quote, a comment, Python's Ellipsis); the form they kept, this one,
looks at whole-file writes only (`Write`, `write_file`, `create_file` and the like; an edit is partial by
nature) and only for explicit elision markers (`ELISION_MARKERS`).

A blocked call becomes a text block at its place, which says which write was blocked, the marker found,
and what to do instead (the whole content, or an edit tool): text, because it is the one block that both
the user reads in Claude Code and the model reads back in its own turn next time (Claude Code sends the
assistant's blocks back as they came), and nothing runs. A tool call altered to fail instead (its input
emptied) would make Claude Code retry by itself, but with a validation error that tells neither the user
nor the model why, and a bridge that rewrites a tool's input could as well write a wrong file. When the
blocked call was the answer's only one, `stop_reason` is `end_turn`: Claude Code shows the text and waits
for the user, for whom one "go on" costs less than a truncated file found later; when other calls remain,
they go through and `stop_reason` stays `tool_use`: Claude Code runs them, and the model reads the text
with their results in its next turn.

Streamed, a whole-file write's block is held back until its arguments end (the next block starts, or the
stream does), then said whole or replaced: see `stream.StreamTranslator.hold`. The client sees such a
call at once when it is complete rather than piece by piece; every other tool streams as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec

from runtime.bridge.nesting import MAX_JSON_DEPTH, nests_deeper_than

# Whole-file write tools by their name squashed (`squashed`), with the label that metrics and traces give
# them: a bounded set, whatever name the model writes. Edit, MultiEdit, str_replace… are not here: partial.
WHOLE_FILE_WRITES = {
    "write": "Write",  # Claude Code's, {file_path, content}
    "writefile": "write_file",  # the MCP filesystem server's and many agents', {path, content}
    "createfile": "create_file",  # {path, content}, or {path, file_text}
    "writetofile": "write_to_file",  # Cline's and Roo Code's, {path, content}
}
PATH_KEYS = ("file_path", "path", "filename", "file", "target_file")  # every other string is content
DOTS = r"(?:\.{3}|…)"  # three dots or the ellipsis character, as models write them
# Explicit elision markers only: each says that something was left out. Not a bare `[...]`, `# ...` or
# `...` (the field notes' false positives in real sessions: a markdown quote, a comment, Python's Ellipsis).
# No two runs of `\s` can take the same spaces (`\(\s*{DOTS}?\s*` took 4 s on `(` and 20,000 spaces): linear.
ELISION_MARKERS = (
    re.compile(rf"{DOTS}\s*(?:the\s+)?rest\s+of\s+(?:the\s+)?(?:file|code)\b", re.I),  # `# ... rest of file unchanged`
    re.compile(rf"\(\s*(?:{DOTS}\s*)?rest\s+of\s+(?:the\s+)?(?:file|code)\s+(?:is\s+|remains\s+)?unchanged", re.I),  # `(rest of the file unchanged)`
    re.compile(rf"\[\s*{DOTS}\s*previous(?:\s+code)?\s*{DOTS}\s*\]", re.I),  # `[... previous ...]`, `[... previous code ...]`
    re.compile(r"<\s*unchanged\s*>", re.I),  # `<unchanged>`
    re.compile(rf"{DOTS}\s*existing\s+code\s*{DOTS}", re.I),  # `// ... existing code ...`
    re.compile(rf"\(\s*(?:{DOTS}\s*)?reste\s+du\s+fichier\b", re.I),  # `(reste du fichier inchangé)`
    re.compile(rf"{DOTS}\s*(?:le\s+)?reste\s+du\s+(?:code|fichier)\b", re.I),  # `# ... reste du code`
    re.compile(r"[(<]\s*inchang[ée]e?s?\s*[)>]", re.I),  # `(inchangé)`, `<inchangé>`
    re.compile(rf"\[\s*{DOTS}\s*code\s+pr[ée]c[ée]dent\s*{DOTS}\s*\]", re.I),  # `[... code précédent ...]`
)  # fmt: skip
MARKER_CHARS = 80  # the marker's line as quoted back: enough to find it, never the content
PATH_CHARS = 300


@dataclass(frozen=True)
class BlockedWrite:
    """A whole-file write refused: the tool as the model called it, its label (one of WHOLE_FILE_WRITES'),
    the file it named, and where the marker is (the line's number, and the line, stripped and cut)."""

    tool: str
    label: str
    path: str
    line: int
    marker: str


def squashed(name: str) -> str:
    """A tool name as WHOLE_FILE_WRITES knows it: lower case, without `_` and `-`, and without the
    `mcp__<server>__` prefix that Claude Code gives an MCP server's tools."""
    return name.rpartition("__")[2].replace("_", "").replace("-", "").lower()


def whole_file_write(name: str) -> str | None:
    """The label of a whole-file write tool (`Write`, `write_file`…); None for any other tool, whose
    calls stream untouched."""
    return WHOLE_FILE_WRITES.get(squashed(name))


def arguments_object(arguments: str) -> dict[str, Any]:
    """The call's arguments as an object; `{}` when they are not one (cut short by max_tokens, invalid,
    nested too deep): such a call goes through as ever, its warning said once, by the assembler."""
    if not arguments or nests_deeper_than(arguments.encode(), MAX_JSON_DEPTH):
        return {}
    try:
        value = msgspec.json.decode(arguments)
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def elision(content: str) -> tuple[int, str] | None:
    """(line number, that line) of the first explicit elision marker in `content`; None when it has none."""
    found = [match for pattern in ELISION_MARKERS if (match := pattern.search(content))]
    if not found:
        return None
    start = min(match.start() for match in found)
    begin, end = content.rfind("\n", 0, start) + 1, content.find("\n", start)
    line = content[begin : end if end >= 0 else len(content)].strip()
    return content.count("\n", 0, start) + 1, line[:MARKER_CHARS] + ("…" if len(line) > MARKER_CHARS else "")


def truncated_write(name: str, arguments: str) -> BlockedWrite | None:
    """The call, when it is a whole-file write whose content holds an explicit elision marker; None when it
    may go through (another tool, arguments that are no JSON object, content without a marker)."""
    label = whole_file_write(name)
    if label is None:
        return None
    values = arguments_object(arguments)
    path = next((value for key in PATH_KEYS if isinstance(value := values.get(key), str)), "")
    for key, content in values.items():
        if key not in PATH_KEYS and isinstance(content, str) and (marker := elision(content)):
            return BlockedWrite(name, label, path, *marker)
    return None


def notice(write: BlockedWrite) -> str:
    """The text that takes a blocked call's place: for the user who reads it and the model that reads it
    back, which write, why (the marker, quoted), that nothing was written, and what to do instead."""
    path = write.path[:PATH_CHARS] or "the file"
    return (
        f"[vllm-pod guard] The write to {path} ({write.tool}) was blocked: line {write.line} of its content is an "
        f'elision marker, "{write.marker}", and writing it would have replaced the rest of the file with that '
        "placeholder. Nothing was written. Write the whole file, every line of it, or change only what changes "
        "with an edit tool (Edit). A marker meant to be in the file can be written with an edit tool; the pod's "
        "VL_GUARD=off turns this guard off."
    )
