"""What leaves a log for the Hub or a terminal carries no control sequence: the published log (against
the test Hub) and `python -m runtime logs` (run as a user runs it). Also `loggable`'s table, and the
Hub log's tail reading on through a log the supervisor rotated."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.hub.logpublish import LogPublisher
from runtime.hub.repo import HubRepo
from runtime.logfiles import tail
from runtime.logsafe import CLIENT_VALUE_CHARS, loggable, strip_controls
from runtime.redact import MARKER, Redactor
from tests.support.hub_server import HubServer
from tests.support.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
REPO = "pod-owner/pod-logs"
# Anything a terminal acts on: C0 but tab and newline, DEL, C1 (U+0080..U+009F: xterm reads U+009B as CSI).
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
SECRET = "hf_" + "S" * 30

# (what it is, hostile text, what must be left of it); each sequence sits inside ordinary words.
SEQUENCES = [
    ("colour (CSI SGR)", "a \x1b[1;31mred\x1b[0m b", "a red b"),
    ("clipboard write, OSC 52 ended by BEL", "a \x1b]52;c;ZWNobyBvd25lZA==\x07b", "a b"),
    ("window title, OSC 0 ended by ST", "a \x1b]0;you have been owned\x1b\\b", "a b"),
    ("hyperlink, OSC 8", "a \x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\ b", "a link b"),
    ("OSC cut off at the end of its line", "a \x1b]2;title without end", "a "),
    ("device control string", "a \x1bP1$r0m\x1b\\b", "a b"),
    ("application program command", "a \x1b_payload\x1b\\b", "a b"),
    ("privacy message and start of string", "a \x1b^pm\x1b\\\x1bXsos\x1b\\b", "a b"),
    ("clear screen and cursor home (CSI)", "a \x1b[2J\x1b[Hb", "a b"),
    ("private mode (CSI ?)", "a \x1b[?1049hb", "a b"),
    ("8-bit CSI and OSC (C1)", "a \x9b2J\x9d0;title\x9cb", "a b"),
    ("full reset and charset (other ESC sequences)", "a \x1bc\x1b(0\x1b7b", "a b"),
    ("a lone ESC", "a \x1b", "a "),
    ("other C0 and C1 controls", "a\x00\x07\x08\x0b\x0c\x0e\x7f\x80\x85 b", "a b"),
    ("tab is text", "a\tb", "a\tb"),
    ("bidi overrides and isolates (Trojan Source)", "a \u202eevil\u202c \u2066x\u2069\u200f b", "a evil x b"),
    ("line and paragraph separators (a new line to some readers)", "a\u2028b\u2029c\u0085d", "abcd"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "text", "left"), SEQUENCES, ids=[case for case, _, _ in SEQUENCES])
def test_control_sequences_are_stripped(case: str, text: str, left: str) -> None:
    assert strip_controls(text) == left


LOGGABLE = [
    ("a plain name stays bare", "claude-tiny", "claude-tiny"),
    ("an alias with its [1m]", "haiku-for-tests[1m]", "haiku-for-tests[1m]"),
    ("a newline cannot forge a line", "a\nfake-log-line key=admin", "'a\\nfake-log-line key=admin'"),
    ("a space cannot forge a field", "x key=admin", "'x key=admin'"),
    ("CR, ESC and C1 are escaped", "a\r\x1b]52;c;eA==\x07\x9b", "'a\\r\\x1b]52;c;eA==\\x07\\x9b'"),
    ("bidi and zero-width characters are escaped", "a\u202eb\u200b", "'a\\u202eb\\u200b'"),
    ("empty", "", "''"),
    ("capped", "m" * (CLIENT_VALUE_CHARS + 5), "m" * CLIENT_VALUE_CHARS + "...(+5 chars)"),
    ("capped before escaping", "\n" * (CLIENT_VALUE_CHARS + 1), repr("\n" * CLIENT_VALUE_CHARS) + "...(+1 chars)"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "value", "logged"), LOGGABLE, ids=[case for case, _, _ in LOGGABLE])
def test_client_values_are_escaped_and_capped(case: str, value: str, logged: str) -> None:
    assert loggable(value) == logged


def test_the_published_log_carries_no_control_sequence(hub_server: HubServer, tmp_path: Path) -> None:
    """Every source and the notes; stripped before redaction, so a sequence cannot split a secret past it."""
    hub_server.create_repo(REPO)
    sources = {name: tmp_path / f"{name}.log" for name in ("boot", "engine", "bridge")}
    sources["boot"].write_text("runtime: starting\n")
    sources["engine"].write_text("".join(f"INFO {text}\n" for _, text, _ in SEQUENCES))
    sources["bridge"].write_text(f"token {SECRET[:10]}\x1b[0m{SECRET[10:]} leaked\n")
    environ = hub_server.env()
    publisher = LogPublisher(HubRepo.from_environ(REPO, environ), "pod-1", sources, lambda: False,
                             Redactor.from_environ(environ), interval_s=0.05, retry_s=(0.05, 0.2))  # fmt: skip
    try:
        publisher.publish_now("engine died \x1b]0;title\x07\x1b[2J")
        publisher.start()
        text = wait_until(lambda: "note" in (published := (hub_server.file(REPO, "etat/pod-1.log") or b"").decode())
                          and published, "the published log")  # fmt: skip
    finally:
        publisher.close(timeout_s=60)
    assert not CONTROL.search(text), repr(CONTROL.search(text))
    rows = text.splitlines()
    assert [row.partition(" | ")[2] for row in rows if row.startswith("engine")] == [
        f"INFO {left}" for *_, left in SEQUENCES
    ]
    assert f"token {MARKER} leaked" in text and "engine died " in text


@pytest.mark.slow  # starts a Python process
def test_runtime_logs_prints_no_control_sequence(hub_server: HubServer, tmp_path: Path) -> None:
    """A log published by an older pod, or written to the repo by anyone who can: the terminal is safe."""
    hub_server.create_repo(REPO)
    hostile = "".join(f"engine | {text}\n" for _, text, _ in SEQUENCES)
    hub_server.put_file(REPO, "etat/pod-1.log", hostile + "note   | \x1b]52;c;cm0gLXJmIH4=\x07done\r\n")
    env = {"PATH": "/usr/bin:/bin", "HF_ENDPOINT": hub_server.endpoint, "HF_HOME": str(tmp_path / "hf-home"),
           "VL_LOG_REPO": REPO}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "runtime", "logs", "pod-1"], cwd=ROOT, env=env,
                          capture_output=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = done.stdout.decode()
    assert not CONTROL.search(printed), repr(CONTROL.search(printed))
    assert printed == "".join(f"engine | {left}\n" for *_, left in SEQUENCES) + "note   | done\n"


def test_the_tail_reads_on_through_a_rotated_log(tmp_path: Path) -> None:
    """Just after the supervisor rotated `bridge.log`, the Hub log still shows the lines before it."""
    lines = [f"line {n} " + "x" * 50 for n in range(300)]
    (tmp_path / "bridge.log.1").write_text("\n".join(lines[:280]) + "\n" + lines[280][:20])  # cut mid-line
    (tmp_path / "bridge.log").write_text(lines[280][20:] + "\n" + "\n".join(lines[281:]) + "\n")
    assert tail(tmp_path / "bridge.log", lines=150) == lines[-150:]
    rows = tail(tmp_path / "bridge.log", lines=150, max_bytes=2000)
    assert rows == lines[-len(rows) :] and 20 < len(rows) < 150  # the older file's part begins mid-line: dropped
    (tmp_path / "bridge.log").write_text("")
    assert tail(tmp_path / "bridge.log", lines=10) == [*lines[271:280], lines[280][:20]]
