"""VL_GUARD: a whole-file write whose content elides the file never reaches Claude Code; the text that
replaces it does, and every other call goes through as ever.

The unit tests drive the real translation path (StreamTranslator, streamed into `AnthropicSse` and
assembled by `MessageAssembler`) with vLLM-shaped chunks of Claude Code's tool calls; the slow ones run
the bridge process in front of a scripted upstream and read what the `anthropic` SDK, the log and
`/metrics` say.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from runtime.bridge.guard import ELISION_MARKERS, WHOLE_FILE_WRITES
from runtime.bridge.metrics import Metrics
from runtime.bridge.sse import AnthropicSse, SseParser
from runtime.bridge.stream import MessageAssembler, StreamTranslator
from runtime.engine import tinymodel as tiny
from tests.support.bridge import SLOW_WAIT_S, Process, start_bridge
from tests.support.sdk import anthropic

PYTHON = (
    'import os\n\n\ndef main() -> None:\n    print(os.getcwd())\n\n\n{}\n\nif __name__ == "__main__":\n    main()\n'
)


def python_with(line: str) -> str:
    """A small Python file with `line` where a function was: what a model writes when it elides."""
    return PYTHON.format(line)


# (tool, arguments, blocked): Claude Code's `Write` and the usual whole-file writes, each marker of the
# notes (English and French), the false positives they removed, and edits, which are never guarded.
CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("Write", {"file_path": "/repo/app.py", "content": python_with("# ... rest of file unchanged")}, True),
    ("Write", {"file_path": "/repo/app.py", "content": python_with("# … rest of the file")}, True),
    ("Write", {"file_path": "/repo/app.js", "content": "const a = 1;\n// ... rest of the code\n"}, True),
    ("Write", {"file_path": "/repo/app.py", "content": python_with("# (rest of the file unchanged)")}, True),
    ("Write", {"file_path": "/repo/app.py", "content": python_with("# (Rest of code unchanged)")}, True),
    ("Write", {"file_path": "/repo/notes.md", "content": "# Notes\n\n[... previous ...]\n\n## New\n"}, True),
    ("Write", {"file_path": "/repo/app.py", "content": python_with("[... previous code ...]")}, True),
    ("Write", {"file_path": "/repo/config.yaml", "content": "a: 1\n<unchanged>\nb: 2\n"}, True),
    ("Write", {"file_path": "/repo/app.ts", "content": "import x from 'x';\n// ... existing code ...\n"}, True),
    ("Write", {"file_path": "/repo/app.py", "content": python_with("# (reste du fichier inchangé)")}, True),
    ("Write", {"file_path": "/repo/app.py", "content": python_with("# ... reste du code")}, True),
    ("Write", {"file_path": "/repo/app.py", "content": python_with("# (inchangé)")}, True),
    ("Write", {"file_path": "/repo/app.html", "content": "<body>\n<inchangé>\n</body>\n"}, True),
    ("Write", {"file_path": "/repo/app.py", "content": python_with("# [... code précédent ...]")}, True),
    ("write_file", {"path": "src/main.rs", "content": "fn main() {}\n// ... rest of file\n"}, True),
    ("create_file", {"path": "src/lib.py", "file_text": python_with("# ... rest of file unchanged")}, True),
    ("writeFile", {"path": "src/a.go", "content": "package a\n// ... existing code ...\n"}, True),
    ("mcp__filesystem__write_file", {"path": "/srv/a.py", "content": python_with("# ... rest of file")}, True),
    # the false positives the notes removed, and prose without an elision's form: written
    ("Write", {"file_path": "/repo/quote.md", "content": "> He said [...] and left.\n"}, False),
    ("Write", {"file_path": "/repo/app.py", "content": python_with("# ...")}, False),
    ("Write", {"file_path": "/repo/stub.pyi", "content": "def f(x: tuple[int, ...]) -> None: ...\nx = ...\n"}, False),
    ("Write", {"file_path": "/repo/story.md", "content": "And the rest of the story... is history.\n"}, False),
    (
        "Write",
        {"file_path": "/repo/doc.md", "content": "Read the rest of the file (it is unchanged since 2024).\n"},
        False,
    ),
    ("Write", {"file_path": "/repo/app.py", "content": python_with("# ... existing code paths handle this")}, False),
    ("write_file", {"path": "src/ok.py", "content": python_with("pass")}, False),
    # edits are partial by nature: a marker there loses nothing
    ("Edit", {"file_path": "/repo/app.py", "old_string": "x = 1", "new_string": "# ... rest of file unchanged"}, False),
    ("MultiEdit", {"file_path": "/repo/app.py", "edits": [{"old_string": "a", "new_string": "<unchanged>"}]}, False),
    (
        "str_replace_based_edit_tool",
        {"command": "str_replace", "path": "/repo/a.py", "old_str": "a", "new_str": "# ... rest of file"},
        False,
    ),
    # Anthropic's own text editor writes a whole file with `create`: guarded like Write; its edits are not
    (
        "str_replace_based_edit_tool",
        {"command": "create", "path": "/repo/a.py", "file_text": python_with("# ... rest of file unchanged")},
        True,
    ),
    (
        "str_replace_editor",
        {"command": "create", "path": "/repo/a.js", "file_text": "const a = 1;\n// ... existing code ...\n"},
        True,
    ),
    (
        "str_replace_based_edit_tool",
        {"command": "create", "path": "/repo/ok.py", "file_text": python_with("pass")},
        False,
    ),
    (
        "str_replace_based_edit_tool",
        {"command": "insert", "path": "/repo/a.py", "insert_line": 3, "new_str": "# ... rest of file unchanged"},
        False,
    ),
]


# What models write in place of code, collected from their whole-file writes (comment styles of Python, JS/TS,
# JSX, C, CSS, HTML, SQL, Lisp/INI, YAML, Markdown; English, French, Spanish, Portuguese, Italian, German,
# Russian, Chinese, Japanese, Korean): each line in a small file of its language, each blocked.
MODELS_WRITE = [
    ("app.py", "# ... (rest of the code remains the same)"),
    ("app.py", "# Rest of the code remains the same"),
    ("app.py", "# ... rest of the implementation unchanged ..."),
    ("app.py", "# ... other methods ..."),
    ("app.py", "# ... all the other functions stay the same ..."),
    ("app.py", "# ... (previous code unchanged)"),
    ("app.py", "# ... (code unchanged)"),
    ("app.py", "# ... same as before ..."),
    ("app.py", "# ... keep the rest as is ..."),
    ("app.py", "# ... 200 more lines ..."),
    ("app.py", "# Implementation omitted for brevity"),
    ("app.py", "# ... (existing imports)"),
    ("test_app.py", "    # ... existing tests remain unchanged"),
    ("app.js", "// ... rest of the code remains unchanged"),
    ("app.js", "// ... (keep existing implementation)"),
    ("app.js", "// ... remaining handlers ..."),
    ("server.ts", "/* ... other routes ... */"),
    ("App.tsx", "      {/* ... rest of the component ... */}"),
    ("app.ts", "// other methods stay the same"),
    ("main.rs", "// [rest of file unchanged]"),
    ("main.go", "// ... previous implementation ..."),
    ("main.c", "/* ... (details omitted for brevity) */"),
    ("index.html", "<!-- ... rest of the page ... -->"),
    ("index.html", "<!-- rest of the HTML stays the same -->"),
    ("style.css", "/* ... other styles unchanged ... */"),
    ("query.sql", "-- ... rest of the query unchanged"),
    ("init.el", ";; ... remaining settings ..."),
    ("config.yaml", "# ... other keys unchanged"),
    ("README.md", "[... rest of the document ...]"),
    ("app.py", "# (unchanged)"),
    ("app.py", "# [snip]"),
    ("app.py", "# ... le reste du code reste inchangé"),
    ("app.js", "// ... code existant ..."),
    ("app.py", "# (les autres méthodes sont inchangées)"),
    ("app.js", "// ... resto del código sin cambios"),
    ("app.py", "# ... el código existente ..."),
    ("app.js", "// ... resto do código permanece igual"),
    ("app.js", "// ... resto del codice invariato"),
    ("app.js", "// ... restlicher Code unverändert"),
    ("app.py", "# Rest des Codes bleibt gleich"),
    ("app.js", "// ... остальной код без изменений"),
    ("app.js", "// ... 其余代码保持不变"),
    ("app.py", "# 其余代码保持不变"),
    ("app.js", "// ... 省略 ..."),
    ("app.js", "// ... 残りのコードは変更なし"),
    ("app.js", "// ... 나머지 코드는 동일"),
    # the six that an earlier guard let through (issue 46)
    ("test_app.py", "# ... all other tests remain the same ..."),
    ("app.js", "// ... (imports unchanged)"),
    ("app.py", "# Code continues as before..."),
    ("app.py", "# same as above"),
    ("App.jsx", "      {/* ... rest of JSX ... */}"),
    ("app.js", "// 생략"),
]
# What real files hold that looks alike: written.
REAL_CODE = [
    ("app.js", "const { a, ...rest } = obj;"),
    ("app.js", "function f(...args) { return g(...args); }"),
    ("app.js", "const [first, ...remaining] = items;"),
    ("app.py", "# Other helpers"),
    ("app.js", "// Previous implementation used a lock; this one does not."),
    ("README.md", "## Other methods"),
    ("index.html", "<!-- Other sections -->"),
    ("query.sql", "-- other columns"),
    ("app.py", "# Rest of the file: helpers"),
    ("app.py", "print('...')"),
    ("app.py", "# TODO: handle the rest"),
    ("README.md", "See the rest of the code below."),
    ("template.js", "// ... your code here ..."),
    ("index.html", "<!-- ... -->"),
    ("main.c", "/* ... */"),
    ("README.md", "(see the other methods)"),
    ("app.py", "# ... more to come"),
    ("app.py", "# ... other code paths handle this"),
    ("app.py", "x = y  # same as above"),
]


def in_a_file(name: str, line: str) -> str:
    """`line` where a function was, in a small file of `name`'s language."""
    return python_with(line) if name.endswith(".py") else f"first = 1;\n{line}\nlast = 2;\n"


CASES += [
    ("Write", {"file_path": f"/repo/{name}", "content": in_a_file(name, line)}, True) for name, line in MODELS_WRITE
]
CASES += [
    ("Write", {"file_path": f"/repo/{name}", "content": in_a_file(name, line)}, False) for name, line in REAL_CODE
]


def case_id(case: tuple[str, dict[str, Any], bool]) -> str:
    """`tool-blocked-<the content's telling line>`: its marker's line, else the first that the scaffold lacks."""
    tool, arguments, blocked = case
    lines = [line for line in str(list(arguments.values())[-1]).splitlines() if line.strip()]
    marked = [line for line in lines if any(pattern.search(line) for pattern in ELISION_MARKERS)]
    line = (marked or [line for line in lines if line not in PYTHON.splitlines()])[0]
    return f"{tool}-{'blocked' if blocked else 'passed'}-{line.strip()[:40]}"


# --- vLLM's chunks, as its OpenAI server streams a tool call ---


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return msgspec.json.encode({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def call_chunks(index: int, name: str, arguments: dict[str, Any], piece_chars: int = 7) -> list[bytes]:
    """One tool call: its name and id first, then its JSON arguments in pieces of `piece_chars`."""
    text = json.dumps(arguments, ensure_ascii=index % 2 == 1)  # both forms: raw UTF-8 and \\u escapes
    start = {"index": index, "id": f"chatcmpl-tool-{index:04x}c0ffee", "type": "function",
             "function": {"name": name, "arguments": ""}}  # fmt: skip
    pieces = [text[at : at + piece_chars] for at in range(0, len(text), piece_chars)]
    return [chunk({"tool_calls": [start]})] + [
        chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}) for piece in pieces
    ]


def answer_chunks(*calls: tuple[str, dict[str, Any]], text: str = "", piece_chars: int = 7) -> list[bytes]:
    """A whole answer: an optional text, the calls, then vLLM's finish and `[DONE]`."""
    chunks = [chunk({"role": "assistant", "content": ""})] + ([chunk({"content": text})] if text else [])
    for index, (name, arguments) in enumerate(calls):
        chunks += call_chunks(index, name, arguments, piece_chars)
    return [*chunks, chunk({}, "tool_calls" if calls else "stop"), b"[DONE]"]


def assembled(chunks: list[bytes], guard: bool = True) -> tuple[dict[str, Any], StreamTranslator]:
    """The non-streamed message, as the bridge assembles it from the same events."""
    sink = MessageAssembler()
    translator = StreamTranslator(sink, "msg_1", "claude-test", guard=guard)
    for payload in chunks:
        translator.feed(payload)
    return sink.message, translator


def streamed(chunks: list[bytes], guard: bool = True) -> list[dict[str, Any]]:
    """The SSE events a streaming client reads, in order, checked against Anthropic's protocol."""
    sink = AnthropicSse()
    translator = StreamTranslator(sink, "msg_1", "claude-test", guard=guard)
    for payload in chunks:
        translator.feed(payload)
    events = [msgspec.json.decode(data) for data in SseParser().feed(sink.take())]
    assert_well_ordered(events)
    return events


def assert_well_ordered(events: list[dict[str, Any]]) -> None:
    """message_start; blocks with consecutive indexes, each started, its deltas, stopped; message_delta and
    message_stop last; each delta of its block's kind."""
    assert events[0]["type"] == "message_start" and [e["type"] for e in events[-2:]] == [
        "message_delta",
        "message_stop",
    ]
    kinds = {"text": "text_delta", "tool_use": "input_json_delta", "thinking": "thinking_delta"}
    expected, open_kind = 0, None
    for event in events[1:-2]:
        if event["type"] == "content_block_start":
            assert open_kind is None and event["index"] == expected, event
            open_kind = event["content_block"]["type"]
        elif event["type"] == "content_block_delta":
            assert open_kind is not None and event["index"] == expected, event
            assert event["delta"]["type"] in (kinds[open_kind], "signature_delta"), event
        elif event["type"] == "content_block_stop":
            assert open_kind is not None and event["index"] == expected, event
            open_kind, expected = None, expected + 1
        else:
            assert event["type"] == "message_delta" and event["delta"]["stop_reason"] is None, event
    assert open_kind is None


def blocks_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The content blocks a streaming client builds from the events (what the SDK's accumulator does)."""
    blocks: list[dict[str, Any]] = []
    partial = ""
    for event in events:
        if event["type"] == "content_block_start":
            blocks.append(dict(event["content_block"]))
            partial = ""
        elif event["type"] == "content_block_delta" and event["delta"]["type"] == "text_delta":
            blocks[-1]["text"] += event["delta"]["text"]
        elif event["type"] == "content_block_delta" and event["delta"]["type"] == "input_json_delta":
            partial += event["delta"]["partial_json"]
        elif event["type"] == "content_block_stop" and blocks[-1]["type"] == "tool_use":
            blocks[-1]["input"] = json.loads(partial) if partial else {}
    return blocks


def stop_reason(events: list[dict[str, Any]]) -> str:
    return events[-2]["delta"]["stop_reason"]


def assert_notice(block: dict[str, Any], path: str) -> None:
    """The text a user reads in Claude Code, and the model in its next turn: which write, and what to do."""
    assert block["type"] == "text", block
    text = block["text"]
    assert text.startswith(f"[vllm-pod guard] The write to {path} ("), text
    assert "was blocked" in text and "Nothing was written" in text
    assert "Write the whole file" in text and "edit tool" in text


# --- the table: each marker, each false positive, each tool ---


@pytest.mark.parametrize(("tool", "arguments", "blocked"), CASES, ids=[case_id(case) for case in CASES])
def test_a_whole_file_write_that_elides_the_file_becomes_a_text(tool: str, arguments: dict, blocked: bool) -> None:
    chunks = answer_chunks((tool, arguments))
    message, translator = assembled(chunks)
    events = streamed(chunks)
    for content, reason in ((message["content"], message["stop_reason"]), (blocks_of(events), stop_reason(events))):
        assert len(content) == 1
        if blocked:
            assert_notice(content[0], arguments.get("file_path") or arguments["path"])
            assert reason == "end_turn", "the only call was blocked: nothing to run, the user reads why"
        else:
            assert content[0]["type"] == "tool_use" and content[0]["name"] == tool
            assert content[0]["input"] == arguments and reason == "tool_use"
    assert [write.tool for write in translator.blocked] == ([tool] if blocked else [])


@pytest.mark.parametrize("marker", ["... rest of file", "(rest of the file unchanged)", "<unchanged>",
                                    "[... previous ...]", "(reste du fichier", "[... code précédent ...]"])  # fmt: skip
def test_the_notice_quotes_the_marker_s_line_and_not_the_content(marker: str) -> None:
    content = "SECRET = 'do not echo me'\n" * 50 + f"    # {marker} here\n" + "tail = 1\n" * 50
    message, translator = assembled(answer_chunks(("Write", {"file_path": "/r/a.py", "content": content})))
    text = message["content"][0]["text"]
    assert f'line 51 of its content is an elision marker, "# {marker} here"' in text
    assert "SECRET" not in text and "tail" not in text
    (write,) = translator.blocked
    assert (write.label, write.path, write.line, write.marker) == ("Write", "/r/a.py", 51, f"# {marker} here")


def test_every_marker_of_the_table_is_one_of_the_documented_patterns() -> None:
    """Each blocked case is found by one of ELISION_MARKERS' patterns, and each pattern blocks some case:
    the list and the table agree."""
    blocked = [arguments.get("content") or arguments["file_text"] for _, arguments, is_blocked in CASES if is_blocked]
    for content in blocked:
        assert any(pattern.search(content) for pattern in ELISION_MARKERS), content
    for pattern in ELISION_MARKERS:
        assert any(pattern.search(content) for content in blocked), pattern.pattern


# --- streaming: held back, then said whole or replaced ---


def test_a_streamed_write_split_inside_its_marker_is_held_then_replaced_by_a_text() -> None:
    """The arguments come in 3-character pieces (the marker split across many chunks); nothing of the call
    reaches the client before its arguments end, then a text block takes its index: no input_json_delta."""
    content = python_with("# ... rest of file unchanged") + "# [... code précédent ...]\n"
    chunks = answer_chunks(("Write", {"file_path": "/repo/app.py", "content": content}), text="Writing it.",
                           piece_chars=3)  # fmt: skip
    sink = AnthropicSse()
    translator = StreamTranslator(sink, "msg_1", "claude-test")
    said: list[dict[str, Any]] = []
    for payload in chunks:
        translator.feed(payload)
        now = [msgspec.json.decode(data) for data in SseParser().feed(sink.take())]
        if not translator.done:
            assert not any(e.get("index") == 1 for e in now), "a held call says nothing before its end"
        said += now
    assert len(chunks) > 50 and not any(b"rest of file" in payload for payload in chunks), "split inside the marker"
    assert_well_ordered(said)
    assert [(e["type"], e.get("index")) for e in said[1:]] == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("message_delta", None), ("message_stop", None),
    ]  # fmt: skip
    text, notice = blocks_of(said)
    assert text == {"type": "text", "text": "Writing it."}
    assert_notice(notice, "/repo/app.py")
    assert '"# ... rest of file unchanged"' in notice["text"] and stop_reason(said) == "end_turn"


def test_a_clean_write_is_said_whole_once_its_arguments_end() -> None:
    arguments = {"file_path": "/repo/app.py", "content": python_with("# the rest of main() follows")}
    events = streamed(answer_chunks(("Write", arguments), piece_chars=3))
    pieces = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"]
    assert len(pieces) == 1 and json.loads(pieces[0]) == arguments, "held, then its whole input at once"
    assert blocks_of(events) == [{"type": "tool_use", "id": "toolu_0000c0ffee", "name": "Write", "input": arguments}]
    assert stop_reason(events) == "tool_use"


def test_other_tools_still_stream_piece_by_piece() -> None:
    arguments = {"command": "cat app.py  # ... rest of file unchanged", "description": "show it"}
    events = streamed(answer_chunks(("Bash", arguments), piece_chars=3))
    pieces = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"]
    assert len(pieces) > 10 and json.loads("".join(pieces)) == arguments


# --- several calls: only the truncated write is replaced ---


@pytest.mark.parametrize("order", ["write-first", "write-last"])
def test_with_another_call_only_the_write_is_replaced_and_the_turn_goes_on(order: str) -> None:
    """The other call runs (`tool_use`), and the model reads why its write was not made with that call's result."""
    bash = ("Bash", {"command": "ls", "description": "list"})
    write = ("Write", {"file_path": "/repo/app.py", "content": python_with("# (rest of the file unchanged)")})
    calls = (write, bash) if order == "write-first" else (bash, write)
    chunks = answer_chunks(*calls, text="Two things.")
    message, translator = assembled(chunks)
    events = streamed(chunks)
    for content, reason in ((message["content"], message["stop_reason"]), (blocks_of(events), stop_reason(events))):
        assert content[0] == {"type": "text", "text": "Two things."}
        kinds = [block["type"] for block in content[1:]]
        assert kinds == (["text", "tool_use"] if order == "write-first" else ["tool_use", "text"])
        tool_use = next(block for block in content if block["type"] == "tool_use")
        assert (tool_use["name"], tool_use["input"]) == ("Bash", bash[1])
        assert_notice(next(block for block in content[1:] if block["type"] == "text"), "/repo/app.py")
        assert reason == "tool_use"
    assert [write.label for write in translator.blocked] == ["Write"]


def test_two_writes_one_truncated_one_whole() -> None:
    whole = {"file_path": "/repo/b.py", "content": python_with("pass")}
    chunks = answer_chunks(("Write", {"file_path": "/repo/a.py", "content": "x = 1\n<unchanged>\n"}), ("Write", whole))
    events = streamed(chunks, guard=True)
    notice, tool_use = blocks_of(events)
    assert_notice(notice, "/repo/a.py")
    assert (tool_use["type"], tool_use["input"]) == ("tool_use", whole) and stop_reason(events) == "tool_use"


# --- VL_GUARD=off, and the counter ---


def test_with_the_guard_off_every_write_goes_through_as_it_streams() -> None:
    arguments = {"file_path": "/repo/app.py", "content": python_with("# ... rest of file unchanged")}
    chunks = answer_chunks(("Write", arguments), piece_chars=5)
    message, translator = assembled(chunks, guard=False)
    events = streamed(chunks, guard=False)
    assert message["content"][0]["input"] == arguments and message["stop_reason"] == "tool_use"
    pieces = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"]
    assert len(pieces) > 10, "not held: streamed as it came"
    assert blocks_of(events)[0]["input"] == arguments and stop_reason(events) == "tool_use"
    assert translator.blocked == []


def test_the_counter_has_a_series_per_tool_from_the_start_and_counts_each_block() -> None:
    metrics = Metrics(lambda: 0)
    text = metrics.render().decode()
    for label in WHOLE_FILE_WRITES.values():
        assert f'bridge_guard_blocked_total{{tool="{label}"}} 0.0' in text
    metrics.count_blocked_write("Write")
    metrics.count_blocked_write("Write")
    metrics.count_blocked_write("create_file")
    text = metrics.render().decode()
    assert 'bridge_guard_blocked_total{tool="Write"} 2.0' in text
    assert 'bridge_guard_blocked_total{tool="create_file"} 1.0' in text
    assert metrics.writes_blocked() == 3


# --- the bridge itself, in front of a scripted upstream: what Claude Code, the log and /metrics see ---

# A path that tries to forge a log line, and content that must never reach the log.
FORGED_PATH = "/repo/evil.py\ntrace id=forged POST /v1/messages 200 key=admin"
SECRET = "SECRET-CONTENT-7f3a"
SCRIPTS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "truncated": [("Write", {"file_path": FORGED_PATH, "content": f"{SECRET} = 1\n# ... rest of file unchanged\n"})],
    "two": [("Bash", {"command": "ls", "description": "list"}),
            ("Write", {"file_path": "/repo/a.py", "content": "a = 1\n// ... existing code ...\n"})],
    "whole": [("Write", {"file_path": "/repo/a.py", "content": python_with("pass")})],
}  # fmt: skip
WRITE_TOOLS = [
    {"name": "Write", "description": "Write a file.", "input_schema": {"type": "object", "properties": {
        "file_path": {"type": "string"}, "content": {"type": "string"}}, "required": ["file_path", "content"]}},
    {"name": "Bash", "description": "Run a command.", "input_schema": {"type": "object", "properties": {
        "command": {"type": "string"}, "description": {"type": "string"}}, "required": ["command"]}},
]  # fmt: skip


class ScriptedUpstream(BaseHTTPRequestHandler):
    """Just enough of vLLM's OpenAI server: its model, /tokenize, /metrics, and a chat completion streamed
    as the script named by the last user message (`SCRIPTS`) in small pieces."""

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self.reply(b'{"object":"list","data":[{"id":"fake","object":"model","created":0,"max_model_len":65536}]}')
        else:
            self.reply(b"", "text/plain")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path != "/v1/chat/completions":
            self.reply(b'{"count":10,"max_model_len":65536,"tokens":[]}')
            return
        last = body["messages"][-1]["content"]
        name = last if isinstance(last, str) else "".join(part.get("text", "") for part in last)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for payload in answer_chunks(*SCRIPTS[name.strip()], piece_chars=4):
            self.wfile.write(b"data: " + payload + b"\n\n")
            self.wfile.flush()

    def reply(self, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedUpstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def ask(bridge: Process, script: str, stream: bool) -> anthropic.types.Message:
    client = anthropic.Anthropic(base_url=bridge.url, api_key="unused", max_retries=0)
    request: dict[str, Any] = {"model": "claude-test", "max_tokens": 1000, "tools": WRITE_TOOLS,
                               "messages": [{"role": "user", "content": script}]}  # fmt: skip
    if stream:
        with client.messages.stream(**request) as events:
            return events.get_final_message()
    return client.messages.create(**request)


@pytest.mark.slow
def test_the_bridge_blocks_it_for_claude_code_and_says_so_in_its_log_and_metrics(upstream: str, tmp_path: Path) -> None:
    """Through the bridge process and the SDK (which rejects malformed or out-of-order events), streamed
    and not: the client reads the text, the log one escaped line without the content, /metrics the count."""
    with start_bridge(upstream, tmp_path / "bridge.log") as bridge:
        for stream in (False, True):
            truncated = ask(bridge, "truncated", stream)
            assert [block.type for block in truncated.content] == ["text"] and truncated.stop_reason == "end_turn"
            assert truncated.content[0].text.startswith(f"[vllm-pod guard] The write to {FORGED_PATH} (Write)")
            line = bridge.wait_for_log(f"guard blocked a truncated write id={truncated.id} ", SLOW_WAIT_S)
            assert f"tool=Write path={FORGED_PATH!r} line=2 marker='# ... rest of file unchanged'" in line
            bridge.wait_for_log(f"trace id={truncated.id} .* stop=end_turn", SLOW_WAIT_S)

            two = ask(bridge, "two", stream)
            assert [block.type for block in two.content] == ["tool_use", "text"] and two.stop_reason == "tool_use"
            assert two.content[0].input == SCRIPTS["two"][0][1]

            whole = ask(bridge, "whole", stream)
            assert [(b.type, b.input) for b in whole.content if b.type == "tool_use"] == [
                ("tool_use", SCRIPTS["whole"][0][1])
            ]
        metrics = httpx.get(f"{bridge.url}/metrics", timeout=SLOW_WAIT_S).text
    assert 'bridge_guard_blocked_total{tool="Write"} 4.0' in metrics
    log = bridge.log()
    assert SECRET not in log
    assert not re.search(r"^trace id=forged", log, re.MULTILINE), "the model's path forged no log line"


def test_real_vllm_s_write_of_an_elided_file_becomes_the_notice(bridge: Process) -> None:
    """The tiny model's Write (tinymodel.MARK_WRITE), as vLLM's hermes parser streams it, through the session's
    bridge to the SDK, streamed and not: the notice at its place, the turn ended, the count in /metrics."""
    client = anthropic.Anthropic(base_url=bridge.url, api_key="unused", max_retries=0, timeout=SLOW_WAIT_S)
    before = bridge_blocked(bridge)
    request: dict[str, Any] = {"model": tiny.SERVED_NAME, "max_tokens": 300, "tools": WRITE_TOOLS,
                               "messages": [{"role": "user", "content": f"Rewrite app.py {tiny.MARK_WRITE}"}]}  # fmt: skip
    with client.messages.stream(**request) as events:
        streamed_answer = events.get_final_message()
    for message in (client.messages.create(**request), streamed_answer):
        assert [block.type for block in message.content] == ["text"] and message.stop_reason == "end_turn"
        assert_notice(message.content[0].model_dump(), tiny.WRITE_ARGUMENTS["file_path"])
        assert f'"{tiny.WRITE_MARKER}"' in message.content[0].text
    assert bridge_blocked(bridge) == before + 2


def bridge_blocked(bridge: Process) -> float:
    metrics = httpx.get(f"{bridge.url}/metrics", timeout=SLOW_WAIT_S).text
    return float(re.search(r'^bridge_guard_blocked_total\{tool="Write"\} (\S+)$', metrics, re.MULTILINE).group(1))


@pytest.mark.slow
def test_with_vl_guard_off_the_bridge_passes_the_write(upstream: str, tmp_path: Path) -> None:
    with start_bridge(upstream, tmp_path / "bridge.log", {"VL_GUARD": "off"}) as bridge:
        for stream in (False, True):
            message = ask(bridge, "truncated", stream)
            assert [(b.type, b.input) for b in message.content] == [("tool_use", SCRIPTS["truncated"][0][1])]
            assert message.stop_reason == "tool_use"
        metrics = httpx.get(f"{bridge.url}/metrics", timeout=SLOW_WAIT_S).text
    assert 'bridge_guard_blocked_total{tool="Write"} 0.0' in metrics
    assert "guard blocked" not in bridge.log()
