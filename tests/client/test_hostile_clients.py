"""Issue 46 §2: the client commands never hang and never read without limit, whatever the server does. Each runs as
a user runs it (`python -m runtime …`) against a hostile server on loopback (tests/client/hostile_server.py): a byte
dripped every half second, pings without end, 2 GiB declared or a flood with no length, a model id made of terminal
controls. Each ends within its deadline (VLLM_POD_DEADLINE_S makes it seconds) with one line and a non-zero exit,
reads no more than its cap, and prints no control character a server sent."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.checks.bounded import ANSWER_BYTES, DEADLINE_VARIABLE, MIB, STREAM_BYTES
from runtime.client.environment import powershell_literal
from tests.client.hostile_server import DECLARED, Behaviour, Hostile, answer, drip, flood, pings
from tests.support.environ import outer_environ

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 2
RUN_S = 60  # the test's own limit on a command: one that hangs fails here, never the suite
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # every C0 and C1 control but tab and newline
# OSC 52 (writes the clipboard), a C1 CSI that clears the screen, a colour, bells, a bidi override: what a hostile
# server names its model to reach the user's terminal.
HOSTILE_NAME = "\x1b]52;c;ZXZpbA==\x07tiny\x9b2J\x1b[31m\x07\x07\x90x\x9c\u202e-evil"
MODEL = "tiny"


def served() -> dict[str, Behaviour]:
    """The routes of a pod that answers well (a test replaces some by hostile ones)."""
    return {
        "GET /health": answer({"status": "ok", "model": MODEL}),
        "GET /v1/models": answer({"data": [{"id": MODEL, "max_model_len": 4096}]}),
        "POST /v1/messages": answer({"type": "message", "content": [{"type": "text", "text": "hi"}]}),
        "POST /v1/messages/count_tokens": answer({"input_tokens": 1280}),
        "GET /v1/pod/status": answer({"model": {"name": MODEL}, "gpus": []}),
    }


def command(
    *argv: str, deadline: str | None = str(DEADLINE_S), home: Path
) -> tuple[subprocess.CompletedProcess[str], float]:
    """`python -m runtime ARGV`, its result and how long it ran (no key of the developer's, no last pod)."""
    environ = outer_environ("ANTHROPIC_", DEADLINE_VARIABLE) | {"HOME": str(home), "XDG_CONFIG_HOME": str(home)}
    if deadline is not None:
        environ[DEADLINE_VARIABLE] = deadline
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "runtime", *argv], cwd=ROOT, env=environ, capture_output=True,
                          text=True, timeout=RUN_S)  # fmt: skip
    return done, time.monotonic() - began


def one_line(done: subprocess.CompletedProcess[str], status: int = 1) -> str:
    """The one line on stderr of a command that failed, nothing raw from the server anywhere."""
    assert done.returncode == status, done
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not CONTROLS.search(done.stdout + done.stderr), repr(done.stdout + done.stderr)
    return done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("behave", [drip, pings], ids=["drip", "pings"])
def test_status_ends_at_its_deadline_against_a_drip_or_pings(behave, tmp_path: Path) -> None:
    with Hostile({"GET /v1/pod/status": behave}) as server:
        done, took = command("status", server.url, "--key", "k" * 20, home=tmp_path)
    line = one_line(done)
    assert (
        line == f"{server.url}/v1/pod/status: no complete answer within {DEADLINE_S} s (the request's total deadline)\n"
    )
    assert DEADLINE_S <= took < DEADLINE_S + 15  # the deadline, and the interpreter's start: no hang


@pytest.mark.slow
def test_status_reads_no_more_than_its_cap_of_a_declared_2_gib_or_a_flood(tmp_path: Path) -> None:
    with Hostile({"GET /v1/pod/status": flood(DECLARED)}) as server:
        declared, _ = command("status", server.url, "--key", "k" * 20, deadline="30", home=tmp_path)
        sent_declared = server.sent
    assert one_line(declared) == (
        f"{server.url}/v1/pod/status: an answer of 2048 MiB declared, over the {ANSWER_BYTES // MIB} MiB read at most\n"
    )
    with Hostile({"GET /v1/pod/status": flood(None)}) as server:
        flooded, _ = command("status", server.url, "--key", "k" * 20, deadline="30", home=tmp_path)
        sent_flooded = server.sent
    assert one_line(flooded) == (
        f"{server.url}/v1/pod/status: the answer went past {ANSWER_BYTES // MIB} MiB, the most read of one; stopped there\n"
    )
    # What the server got to write before the client stopped: the cap and the sockets' buffers, never the 2 GiB.
    assert sent_declared < 8 * MIB and sent_flooded < ANSWER_BYTES + 16 * MIB, (sent_declared, sent_flooded)


@pytest.mark.slow
def test_status_says_a_hostile_answer_in_one_line_without_its_controls(tmp_path: Path) -> None:
    refusal = {"error": {"message": f"no\nsuch\r\x1b[2Jpod {HOSTILE_NAME}"}}
    with Hostile({"GET /v1/pod/status": answer(refusal, 500)}) as server:
        refused, _ = command("status", server.url, "--key", "k" * 20, home=tmp_path)
    assert one_line(refused).startswith(f"{server.url}/v1/pod/status answered 500: no such pod ")
    with Hostile({"GET /v1/pod/status": answer({"model": 5, "engine": [HOSTILE_NAME]})}) as server:
        strange, _ = command("status", server.url, "--key", "k" * 20, home=tmp_path)
    assert one_line(strange).startswith(f"status: {server.url}/v1/pod/status is not a status this client reads")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["connect", "launch"])
def test_connect_and_launch_end_at_their_deadline_against_a_drip_or_pings(name: str, tmp_path: Path) -> None:
    extra = ("--print",) if name == "launch" else ()
    with Hostile(served() | {"GET /health": drip}) as server:
        dripped, took = command(name, server.url, "--key", "k" * 20, *extra, home=tmp_path)
    assert (
        one_line(dripped)
        == f"{name}: {server.url}/health: no complete answer within {DEADLINE_S} s (the request's total deadline)\n"
    )
    assert took < DEADLINE_S + 15
    with Hostile(served() | {"POST /v1/messages": pings}) as server:  # the one token, answered by pings for ever
        pinged, took = command(name, server.url, "--key", "k" * 20, *extra, home=tmp_path)
    assert one_line(pinged) == (
        f"{name}: {server.url}/v1/messages: no complete answer within {DEADLINE_S} s (the request's total deadline)\n"
    )
    assert took < DEADLINE_S + 15


@pytest.mark.slow
@pytest.mark.parametrize("name", ["connect", "launch"])
def test_a_model_id_that_is_not_a_plain_token_is_refused_in_one_line(name: str, tmp_path: Path) -> None:
    extra = ("--print",) if name == "launch" else ()
    models = {"data": [{"id": HOSTILE_NAME, "max_model_len": 4096}]}
    with Hostile(served() | {"GET /v1/models": answer(models)}) as server:
        done, _ = command(name, server.url, "--key", "k" * 20, *extra, home=tmp_path)
    line = one_line(done)
    assert line.startswith(f"{name}: {server.url} serves a model id that is not a plain token: '")
    assert done.stdout == ""  # no environment printed for it
    with Hostile(served() | {"GET /v1/models": answer(models)}) as server:  # nor when it is the one asked for
        asked, _ = command(name, server.url, "--key", "k" * 20, "--model", HOSTILE_NAME, *extra, home=tmp_path)
    assert one_line(asked).startswith(f"{name}: {server.url} serves a model id that is not a plain token: '")


@pytest.mark.slow
def test_check_ends_a_stream_of_pings_at_its_deadline(tmp_path: Path) -> None:
    with Hostile(served() | {"POST /v1/messages stream": pings}) as server:
        done, took = command("check", server.url, "--key", "k" * 20, "--only", "pings", home=tmp_path)
    assert done.returncode == 1 and done.stderr == "" and not CONTROLS.search(done.stdout), done
    assert done.stdout == (
        f"pings                FAILED   OverLimit: {server.url}/v1/messages: no complete answer within {DEADLINE_S} s "
        "(the request's total deadline)\n"
    )
    assert took < DEADLINE_S + 15


@pytest.mark.slow
def test_bench_ends_a_stream_of_pings_at_its_deadline_and_prints_no_control_of_the_pod_s(tmp_path: Path) -> None:
    status = {"model": {"name": HOSTILE_NAME}, "gpus": [{"name": f"GPU {HOSTILE_NAME}"}]}
    routes = served() | {"GET /v1/pod/status": answer(status), "POST /v1/messages stream": pings}
    with Hostile(routes) as server:
        done, took = command("bench", server.url, "--key", "k" * 20, "--quick", home=tmp_path)
    assert one_line(done) == (
        f"runtime bench: OverLimit: {server.url}/v1/messages: no complete answer within {DEADLINE_S} s "
        "(the request's total deadline)\n"
    )
    assert done.stdout == (f"{server.url}: tiny-evil (4,096-token window) on GPU tiny-evil\n")
    assert took < DEADLINE_S + 15


@pytest.mark.slow
def test_bench_reads_no_more_of_a_stream_than_its_cap(tmp_path: Path) -> None:
    with Hostile(served() | {"POST /v1/messages stream": flood(None)}) as server:
        done, _ = command("bench", server.url, "--key", "k" * 20, "--quick", "--json", deadline="60", home=tmp_path)
        sent = server.sent
    assert one_line(done) == (
        f"runtime bench: OverLimit: {server.url}/v1/messages: the answer went past {STREAM_BYTES // MIB} MiB, the most "
        "read of one; stopped there\n"
    )
    assert sent < STREAM_BYTES + 16 * MIB


@pytest.mark.slow
def test_a_deadline_not_allowed_stops_the_command_in_one_line(tmp_path: Path) -> None:
    done, _ = command("status", "http://127.0.0.1:9", deadline="forever", home=tmp_path)
    assert one_line(done, 2) == (
        f"status: {DEADLINE_VARIABLE}='forever' is not allowed: expected a number of seconds in 0.1..86400\n"
    )


@pytest.mark.parametrize("quote", ["'", "\u2018", "\u2019", "\u201a", "\u201b"])
def test_every_quote_powershell_reads_is_doubled_in_a_literal(quote: str) -> None:
    """PowerShell ends a single-quoted string at any of the five; doubled, each stands for itself."""
    literal = powershell_literal(f"sk-{quote}; Remove-Item -Recurse ~ ;{quote}")
    assert literal == f"'sk-{quote * 2}; Remove-Item -Recurse ~ ;{quote * 2}'"


@pytest.mark.slow
def test_pod_up_s_health_reads_end_at_their_deadline_and_its_verdict_is_shown_without_controls() -> None:
    """`pod up`'s /health through the proxy: a drip is "not yet" within its deadline; a verdict comes without its
    controls, in one line."""
    from runtime.client.pods import boot

    with Hostile({"GET /health": drip}) as server:
        began = time.monotonic()
        assert boot.health(server.url, "k" * 20, deadline_s=DEADLINE_S) is None
        assert time.monotonic() - began < DEADLINE_S + 10
    verdict = {"status": "ok", "checked": f"failed: \x1b]0;pwned\x07needle\r\n{HOSTILE_NAME}"}
    with Hostile({"GET /health": answer(verdict)}) as server:
        assert boot.self_checked(server.url, "k" * 20) == "failed: needle tiny-evil"
