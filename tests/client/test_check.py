"""`python -m runtime check` as a user runs it, against the session's bridge in front of real vLLM with the tiny model:
the checks the tiny model can pass pass, and the needle fails honestly (it cannot find a fact); the images it cannot
take are skipped with why. The images themselves are checked to discriminate."""

from __future__ import annotations

import base64
import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

from runtime.checks.images import SIZE, pictures_to_show
from tests.support.bridge import Process

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_check_passes_what_the_tiny_model_can_do_and_fails_the_needle_honestly(bridge: Process) -> None:
    ran = subprocess.run([sys.executable, "-m", "runtime", "check", bridge.url, "--key", "unused", "--json"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800)  # fmt: skip
    print(ran.stdout)  # the check's output on the tiny model, for the record (-s)
    assert ran.returncode == 1, ran.stderr  # a check failed: the needle
    outcomes = {check["name"]: check for check in json.loads(ran.stdout)["checks"]}
    assert list(outcomes) == ["needle", "concurrent-prefills", "tool-round-trip", "thinking", "prefix-cache",
                              "vision", "pings", "engine-alive"]  # fmt: skip
    assert outcomes["needle"]["status"] == "failed" and outcomes["needle"]["detail"].startswith("not found at 10% of")
    for name in ("concurrent-prefills", "tool-round-trip", "thinking", "prefix-cache", "pings", "engine-alive"):
        assert outcomes[name]["status"] == "passed" and outcomes[name]["ok"] is True, outcomes[name]
    assert outcomes["vision"]["status"] == "skipped" and outcomes["vision"]["ok"] is None
    assert outcomes["vision"]["detail"].startswith("the model takes no images")


def pixels_of(png: str) -> list[bytes]:
    """The rows of a PNG `checkimages` wrote (8-bit RGB, no filter), read back."""
    data = base64.b64decode(png)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", data[16:24])
    start = data.index(b"IDAT") + 4
    raw = zlib.decompress(data[start : start + struct.unpack(">I", data[start - 8 : start - 4])[0]])
    stride = 1 + 3 * width
    return [raw[row * stride + 1 : (row + 1) * stride] for row in range(height)]


def test_the_pictures_each_show_what_their_answer_says() -> None:
    pictures = {picture.shows: picture for picture in pictures_to_show()}
    assert len(pictures) == 7
    for name, rgb in (("red", (220, 30, 30)), ("green", (30, 170, 60)), ("blue", (40, 70, 220))):
        rows = pixels_of(pictures[f"a {name} image"].png)
        assert len(rows) == SIZE and set(rows) == {bytes(rgb) * SIZE}
    middle = SIZE // 2
    for count in ("two", "three"):
        row = pixels_of(pictures[f"{count} squares"].png)[middle]
        runs = [i for i in range(1, SIZE) if row[3 * i] == 0 and row[3 * i - 3] != 0]  # where each black run begins
        assert len(runs) == {"two": 2, "three": 3}[count]
    for side in ("left", "right"):
        row = pixels_of(pictures[f"a square on the {side}"].png)[middle]
        black = [i for i in range(SIZE) if row[3 * i] == 0]
        assert (black[0] < middle) == (side == "left") and (black[-1] < middle) == (side == "left")
