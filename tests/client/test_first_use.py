"""What a new user tripped over, run as they ran it: `plan` with a value it cannot use (no traceback, no verdict on
a 0 GiB card: one line naming the value and what is allowed, exit 2), a card by the name its table shows, the Hub
down (one quick try, and the recipes that need no Hub named), `--json` answering JSON whatever fails, `--help`
listing every verb of `pod`, and `pod gpus` without a RunPod key (the built-in table)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.cli import main
from runtime.client import pods
from runtime.sizing.choice import choices, template_model
from runtime.sizing.offers import named_offer, offer_of
from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
USAGE_ERROR = 2  # argparse's exit status for arguments it refuses, and plan's for a card it does not know
TABLE = (
    "RTX 4090, L40S, L40, RTX 6000 Ada, RTX 5090, RTX PRO 6000, RTX 3090, A40, RTX A6000, A100 PCIe 80 GB, "
    "A100 SXM 80 GB, H100 SXM, H100 NVL, H200, B200"
)


@pytest.fixture(autouse=True)
def no_accounts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's shell: no RunPod key, no Hub token, no offline switch."""
    for name in ("RUNPOD_API_KEY", "HF_TOKEN", "HF_HUB_OFFLINE", "VL_MODEL", "VL_CTX", "VL_UTIL"):
        monkeypatch.delenv(name, raising=False)


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The exit status, the last line on stderr and stdout of a command line argparse or the command refuses."""
    try:
        status = main(argv)
    except SystemExit as stop:  # argparse's refusal
        status = int(stop.code or 0)
    out, err = capsys.readouterr()
    return status, err.splitlines()[-1], out


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--sessions", "0"], "argument --sessions: '0' is not allowed: expected a whole number of sessions >= 1"),
        (["--sessions", "-1"], "argument --sessions: '-1' is not allowed: expected a whole number of sessions >= 1"),
        (["--sessions", "two"], "argument --sessions: 'two' is not allowed: expected a whole number of sessions >= 1"),
        (["--context", "-5"], "argument --context: '-5' is not allowed: expected a whole number of tokens >= 256"),
    ],
    ids=["no-sessions", "negative-sessions", "words", "negative-context"],
)
def test_a_count_plan_cannot_use_is_one_line_saying_what_is_allowed(argv, line, capsys) -> None:
    """`--sessions 0` ended in a ZeroDivisionError's traceback; -1 sessions or a window of -5 tokens "fit"."""
    status, last, out = refusal(["plan", *argv], capsys)
    assert (status, last, out) == (USAGE_ERROR, f"python -m runtime plan: error: {line}", "")


def test_with_json_a_refused_argument_is_a_json_error_on_stdout(capsys) -> None:
    status, _, out = refusal(["plan", "--json", "--sessions", "0"], capsys)
    expected = "argument --sessions: '0' is not allowed: expected a whole number of sessions >= 1"
    assert (status, json.loads(out)) == (USAGE_ERROR, {"error": expected})


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090", "RTX 4090", "rtx 4090"])
def test_a_card_is_found_by_runpod_s_id_or_the_name_the_table_shows(name, capsys) -> None:
    """`--gpu "RTX 4090"` sized a card of 0.0 GiB and said it did not fit."""
    assert main(["plan", "--gpu", name]) == 0
    *_, header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["card", "GiB", "arch", "image", "$/h", "fits", "KV", "tokens", "why", "/", "measured"]
    assert row.split()[:8] == ["RTX", "4090", "24.0", "sm89", "sm89", "-", "no", "-"]
    assert row.endswith("30.4 GiB held besides the KV is more than 0.85 of RTX 4090's 24.0 GiB")


def test_an_unknown_card_is_one_line_listing_the_cards(capsys) -> None:
    status, last, out = refusal(["plan", "--gpu", "RTX 4099"], capsys)
    assert (status, out) == (USAGE_ERROR, "")
    assert last == (
        "plan: --gpu 'RTX 4099' is not allowed: expected the id or name of a card in the built-in table (RunPod's "
        f"catalogue with RUNPOD_API_KEY): {TABLE}"
    )


def test_an_unknown_card_with_json_is_a_json_error(capsys) -> None:
    status, last, out = refusal(["plan", "--json", "--gpu", "RTX 4099"], capsys)
    assert (status, json.loads(out)) == (USAGE_ERROR, {"error": last.removeprefix("plan: ")})


def test_a_card_of_runpod_s_catalogue_is_found_by_its_name_and_pod_up_takes_it_too() -> None:
    """The catalogue's own names (a card the built-in table lacks), and `pod up --gpu` with a name as `plan` shows it:
    the GPU type RunPod is asked for is its id."""
    a30 = offer_of({"id": "NVIDIA A30", "name": "A30", "memory": 24, "price": {"secure": 0.22}})
    assert named_offer("a30", [a30]) == a30
    assert named_offer("RTX 4099", [a30]) is None
    catalogue = [{"id": "NVIDIA RTX 6000 Ada Generation", "name": "RTX 6000 Ada", "memory": 48}]
    model = template_model({"VL_MODEL": "nemotron"})
    chosen = choices(catalogue, "sm89", ["rtx 6000 ada"], model, None, say=print)
    assert [choice.gpu for choice in chosen] == ["NVIDIA RTX 6000 Ada Generation"]


def test_with_the_hub_down_plan_fails_at_once_naming_the_recipes_that_need_none(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The Hub's tree listing was retried for 24 s (five retries, "Retrying in 8s"), then one line."""
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    began = time.monotonic()
    assert main(["plan", "--model", "acme/new-model"]) == 1
    took = time.monotonic() - began
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        "plan: cannot read acme/new-model on the Hub: ConnectError: [Errno 111] Connection refused; the built-in "
        "recipes are sized offline: --model codernext, flashnext, nemotron, ornith, ornithnvfp4, qwen, tiny, tiny2\n",
    )
    assert took < 5, took
    assert main(["plan", "--model", "acme/new-model", "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == {"error": err.removeprefix("plan: ").rstrip("\n")}


def test_help_lists_every_verb_of_pod(capsys) -> None:
    """The summary was written by hand and lacked `gpus` and `replace`: it is read from `pod`'s own parser."""
    parser = argparse.ArgumentParser()
    pods.configure(parser)
    (verbs,) = [action.choices for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    assert main(["--help"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  pod ")]
    assert line == "  pod          your pods on RunPod, without its console: " + ", ".join(verbs)
    assert {"up", "watch", "start", "gpus", "status", "stop", "down", "replace"} <= set(verbs)


def test_pod_gpus_without_a_runpod_key_shows_the_built_in_table(capsys) -> None:
    """It stopped at "RUNPOD_API_KEY is empty"; `plan` shows the same cards without a key."""
    assert main(["pod", "gpus"]) == 0
    said, header, *rows = capsys.readouterr().out.splitlines()
    assert said == "(the built-in table of common cards: prices and stock need RUNPOD_API_KEY)"
    assert header.split() == ["id", "GiB", "arch", "image", "secure", "$/h", "community", "$/h", "stock"]
    assert len(rows) == len(TABLE.split(", "))
    assert rows[0].split() == ["NVIDIA", "GeForce", "RTX", "4090", "24.0", "sm89", "sm89", "-", "-", "-"]
    assert rows[-1].split() == ["NVIDIA", "B200", "179.1", "sm100", "sm100", "-", "-", "-"]


@pytest.mark.slow  # a process whose reader has gone: only a real pipe shows it
def test_help_whose_reader_has_gone_ends_quietly() -> None:
    """`vllm-pod --help | head -1` printed a BrokenPipeError traceback once head had gone: here the reader is gone
    before the first write."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run([sys.executable, "-m", "runtime", "--help"], cwd=ROOT, stdout=writer,
                              stderr=subprocess.PIPE, text=True, timeout=60)  # fmt: skip
    finally:
        os.close(writer)
    assert (done.returncode, done.stderr) == (141, "")
