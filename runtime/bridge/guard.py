"""The guard against truncated whole-file writes (VL_GUARD): which tool calls would overwrite a file with
an elided copy of it, and the text block that the client gets in their place.

A model sometimes rewrites a whole file with a placeholder where code was ("# ... rest of file
unchanged"): the tool writes exactly that, and the rest of the user's file is gone without a word. The
field notes' first guard also looked at edits and at a bare `[...]`, `# ...` or `...`, and blocked sound
writes in real sessions (a markdown quote, a comment, Python's Ellipsis); the form they kept, this one,
looks at whole-file writes only (`Write`, `write_file`, `create_file` and the like, and the `create` command of
Anthropic's own text editor, `str_replace_based_edit_tool`; an edit is partial by nature) and only for explicit elision markers (`ELISION_MARKERS`).

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
    "strreplacebasededittool": "str_replace_based_edit_tool",  # Anthropic's text editor: its `create` only
    "strreplaceeditor": "str_replace_editor",  # the same tool's earlier name
}
# Tools that write a whole file only for one command (`{command: create, path, file_text}`); their edits pass.
BY_COMMAND = {"str_replace_based_edit_tool": "create", "str_replace_editor": "create"}
PATH_KEYS = ("file_path", "path", "filename", "file", "target_file")  # every other string is content
DOTS = r"(?:(?<!\.)\.{3,}+|…)"  # three dots or more, or the ellipsis character, as models write them
# An elision marker is a phrase that says what was left out, framed as models frame it and ending there:
#   frame:  a comment's leader (`#`, `//`, `/*`, `<!--`, `--`, `;`, `%`, `*`) and/or dots or a bracket;
#   phrase: what is missing (`rest of the file`, `existing code`, `other methods`, `reste du code`, `其余代码`),
#           then, optionally, what became of it (`remains the same`, `unchanged`, `omitted for brevity`);
#   end:    dots, a closing bracket or comment, or the line's end (`# ... existing code paths handle this` is
#           prose: written).
# After a bare comment leader the phrase must say what became of it: `# Other helpers` heads real code.
# Not a bare `[...]`, `# ...` or `...` (the field notes' false positives in real sessions: a markdown quote,
# a comment, Python's Ellipsis), nor a spread (`...rest`). Every repetition is bounded or possessive, so a
# search stays linear on any content (`\(\s*{DOTS}?\s*` once took 4 s on `(` and 20,000 spaces).
LEADER = r"(?:(?<!#)#++|(?<!/)//++|(?<![/*])/\*++|\{/\*|<!--|(?<!-)--++|(?<!;);++|%|\*)"  # each run taken whole, once
OPENING = r"[\[(<{]"
STARTS = r"(?=[-#/*{<;%.…\[(])"  # what a marker's first character can be: lets the search skip every other one
CLOSED = rf"(?=[ \t]*+[.:;,!]?[ \t]*+(?:{DOTS}|[\])>}}]|\*/|-->|\r?\n|\Z))"
FRAMED = rf"(?:{LEADER}[ \t]*+)?(?:(?:{DOTS}|{OPENING})[ \t]*+){{1,3}}"  # dots or a bracket: the phrase may be bare
COMMENT = rf"{LEADER}[ \t]*+(?:{OPENING}[ \t]*+)?"  # a comment alone: the phrase must say what became of it
NOUN = (
    r"(?:code|files?|functions?|class(?:es)?|methods?|implementations?|components?|modules?|scripts?|quer(?:y|ies)"
    r"|documents?|pages?|html|markup|css|styles?|tests?|(?:test\s+)?cases?|contents?|body|config(?:uration)?"
    r"|jsx|tsx|xml|svg|logic|imports?|programs?|source|lines?|handlers?|routes?|endpoints?|fields?|propert(?:y|ies)|helpers?"
    r"|definitions?|sections?|rules?|exports?|declarations?|dependenc(?:y|ies)|steps?|columns?|options|settings"
    r"|parameters|arguments|examples?|elements?|blocks?|entries|items|keys|values|types|interfaces|structs?"
    r"|variables|constants|hooks|views?|models?|schemas?|migrations?|tasks?|targets?|stuff)"
)
WHAT_IS_MISSING = (
    rf"(?:(?:keep|keeping|leave)\s+)?(?:all\s+(?:the\s+)?|the\s+|this\s+|your\s+)?"
    rf"(?:(?:rest|remainder)\s+of\s+(?:the\s+|this\s+|your\s+)?(?:\w+\s+)?{NOUN}"
    rf"|(?:other|existing|remaining|previous|original|unchanged|same|more|additional|earlier|old|current|prior)"
    rf"\s+(?:\w+\s+)?{NOUN}|\d+\s+(?:more\s+|other\s+|unchanged\s+)?lines?"
    r"|(?:tout\s+)?(?:le\s+)?reste\s+du\s+(?:code|fichier|contenu)|(?:le\s+)?code\s+(?:existant|pr[ée]c[ée]dent)"
    r"|(?:les\s+)?autres\s+(?:fonctions|m[ée]thodes|classes)"  # French
    r"|(?:el\s+)?resto\s+del\s+(?:c[óo]digo|archivo|fichero|contenido)|(?:el\s+)?c[óo]digo\s+(?:existente|anterior)"
    r"|(?:las\s+)?(?:otras|dem[áa]s)\s+(?:funciones|clases)|(?:los\s+)?(?:otros|dem[áa]s)\s+m[ée]todos"  # Spanish
    r"|(?:o\s+)?resto\s+do\s+(?:c[óo]digo|arquivo|ficheiro|conte[úu]do)"  # Portuguese
    r"|(?:il\s+)?resto\s+del\s+(?:codice|file)|(?:il\s+)?codice\s+(?:esistente|precedente)"  # Italian
    r"|(?:der\s+)?rest\s+(?:des\s+codes|der\s+datei)|(?:der\s+)?(?:restliche|übrige|bestehende|vorherige)[rn]?\s+code"
    r"|остальн\w*\s+(?:код\w*|част\w*)|(?:существующий|предыдущий|прежний)\s+код"  # Russian
    r"|其余(?:的)?(?:代码|部分|内容)|其他(?:代码|部分)|现有代码|原有代码|之前的代码"  # Chinese
    r"|残りの(?:コード|部分|処理)|既存の(?:コード|処理)|以前のコード"  # Japanese
    r"|나머지\s*(?:코드|부분)|기존\s*코드)"  # Korean
)
WHAT_BECAME_OF_IT = (
    r"\s*+(?:(?:is|are|remains?|stays?|kept|left|goes|go|continues?|as)\s+){0,2}"
    r"(?:unchanged|the\s+same|same|as\s+(?:is|before|it\s+was|above)|untouched|identical|omitted|elided|not\s+shown"
    r"|truncated|skipped|here|below|above|follows?|not\s+changed)(?:\s+for\s+(?:brevity|clarity|space|readability))?"
    r"|\s*+(?:(?:reste|demeure|est|sont|queda|se\s+mantiene|permanece|fica|resta|rimane|bleibt|ist|остается)\s+)?"
    r"(?:inchang[ée]e?s?|identiques?|sans\s+changement|sin\s+cambios|igual|sem\s+altera[çc][õo]es|inalterad[oa]"
    r"|invariat[oa]|uguale|unver[äa]ndert|gleich|без\s+изменений|не\s+изменяется|прежним|(?:保持)?不变|同上|省略"
    r"|は?変更なし|は?同じ|[은는]?\s*(?:변경\s*없음|동일)|생략)"
)
BARE = r"(?:(?:keep|leave)\s+)?(?:the\s+)?(?:code|rest|remainder|implementation|content|body|imports)"
BREVITY = r"(?:[\w-]+[ \t]+){0,3}?(?:omitted|elided|truncated|skipped|shortened|abbreviated)\s+for\s+(?:brevity|clarity|space|readability)"
SAME_AS = r"same\s+as\s+(?:before|above|(?:the\s+)?original|previous(?:ly)?)"
LEFT_OUT = (  # a bracket that holds only what became of it: `(unchanged)`, `<inchangé>`, `[snip]`
    r"(?:unchanged|inchang[ée]e?s?|sin\s+cambios|sem\s+altera[çc][õo]es|invariato|unver[äa]ndert|без\s+изменений"
    r"|不变|保持不变|変更なし|변경\s*없음|snip(?:ped)?|omitted|elided)"
)
ELISION_MARKERS = (
    # `# ... rest of the code`, `// ... existing code ...`, `(rest of file unchanged)`, `[... previous code ...]`
    re.compile(rf"{STARTS}{FRAMED}(?:{WHAT_IS_MISSING})(?:{WHAT_BECAME_OF_IT})?{CLOSED}", re.I),
    # `# Rest of the code remains the same`, `// other methods stay unchanged`, `# 其余代码保持不变`
    re.compile(rf"{STARTS}{COMMENT}(?:{WHAT_IS_MISSING}|{BARE})(?:{WHAT_BECAME_OF_IT}){CLOSED}", re.I),
    # `# ... (code unchanged)`, `... rest as is ...`, `// ... same as before ...`, `// ... 省略 ...`
    re.compile(rf"{STARTS}{FRAMED}(?:{BARE}(?:{WHAT_BECAME_OF_IT})|{SAME_AS}|省略|생략){CLOSED}", re.I),
    # `// 생략`, `# 省略`, and `# same as above` on a line of its own (after code, a comment says what it does)
    re.compile(rf"{STARTS}{COMMENT}(?:省略|생략){CLOSED}", re.I),
    re.compile(rf"(?:^|(?<=\n))[ \t]*+{COMMENT}{SAME_AS}{CLOSED}", re.I),
    # `// Implementation omitted for brevity`, `# ... (details omitted for brevity)`
    re.compile(rf"{STARTS}(?:{FRAMED}|{COMMENT}){BREVITY}{CLOSED}", re.I),
    # `<unchanged>`, `(inchangé)`, `[snip]`, `[... previous ...]`, `[... code précédent ...]`
    re.compile(rf"{OPENING}[ \t]*+(?:{DOTS}[ \t]*+)?{LEFT_OUT}[ \t]*+(?:{DOTS}[ \t]*+)?[\])>]", re.I),
    re.compile(rf"\[[ \t]*+{DOTS}[ \t]*+(?:previous|code\s+pr[ée]c[ée]dent)[ \t]*+{DOTS}[ \t]*+\]", re.I),
)
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
    if label in BY_COMMAND and values.get("command") != BY_COMMAND[label]:
        return None
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
