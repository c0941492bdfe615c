"""VL_API_KEYS (issue 9, item 9): keys that cannot work are refused at start-up in one line that
never shows a key; an unnamed key's label is an HMAC under a secret salt kept in VL_STATE_DIR.

A bare hash of a key, readable by every key holder on /metrics and by anyone who reads the Hub log,
lets a weak key be found offline; with the pod's secret salt it cannot be tested against guesses.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import stat
import subprocess
import sys
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

from runtime.settings import BY_ENV, SettingsError, load_settings
from tests.support.bridge import ROOT, Process, start_bridge
from tests.support.environ import outer_environ
from tests.support.net import free_port

KEY = "sk-unnamed-0123456789abcdef"
ALLOWED = BY_ENV["VL_API_KEYS"].allowed
# A value, the line that refuses it, and the secret parts that line must never show.
REFUSED = [
    ("sk-short", "entry 1 has 8 characters", ["sk-short"]),
    (f"alice:{KEY}, ci:tooshort", "entry 2 (ci) has 8 characters", [KEY, "tooshort"]),
    (f"{KEY} sk-clé-0123456789abcdef", "entry 2 holds a character an HTTP header cannot carry (non-ASCII or control)",
     [KEY, "sk-clé-0123456789abcdef"]),
    (f"ci:{KEY}\x7f", "entry 1 (ci) holds a character an HTTP header cannot carry (non-ASCII or control)", [KEY]),
    (f"ci:{KEY}, bob:sk-bob-0123456789abcdef, ci:sk-ci2-0123456789abcdef", "entry 3 (ci) repeats the name of entry 1",
     [KEY, "sk-bob-0123456789abcdef", "sk-ci2-0123456789abcdef"]),  # one label would count two keys
    (f"{KEY}, alice:{KEY}", "entry 2 (alice) repeats the key of entry 1", [KEY]),
]  # fmt: skip


def line_for(reason: str) -> str:
    return f"VL_API_KEYS='***' is not allowed: expected {ALLOWED}; {reason}"


@pytest.mark.parametrize(("value", "reason", "secrets"), REFUSED, ids=[r for _, r, _ in REFUSED])
def test_a_key_that_cannot_work_is_refused_in_one_line_without_the_key(
    value: str, reason: str, secrets: list[str]
) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({"VL_API_KEYS": value})
    assert str(caught.value) == line_for(reason)
    assert not any(secret in str(caught.value) for secret in secrets)


@pytest.mark.slow  # `runtime settings` and `runtime start` run as processes
@pytest.mark.parametrize("command", ["settings", "start"])
def test_settings_and_start_refuse_it_alike(command: str, tmp_path: Path) -> None:
    value, reason, secrets = REFUSED[1]
    outer = outer_environ()
    (tmp_path / "prebaked").write_text("{}")
    # Prebaked, and a window the engine's command refuses: were the key let through, start would stop
    # there, before installing or launching anything.
    env = outer | {
        "VL_API_KEYS": value,
        "VL_STATE_DIR": str(tmp_path / "state"),
        "VL_MODEL": "tiny",
        "VL_CTX": "10000000",
        "VL_PREBAKED_MARKER": str(tmp_path / "prebaked"),
        "VL_VENV": sys.prefix,
    }
    result = subprocess.run([sys.executable, "-m", "runtime", command], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120, check=False)  # fmt: skip
    assert (result.returncode, result.stderr.splitlines()) == (2, [line_for(reason)])
    assert not any(secret in result.stdout + result.stderr for secret in secrets)
    assert not (tmp_path / "state").exists(), "nothing was started or written"


def test_real_keys_pass() -> None:
    punctuation = "punctuation:~!@#$%^&*()_+=-[]{}|;'<>?/`"
    keys = load_settings({"VL_API_KEYS": f"{KEY}, ci:{'x' * 16}, {punctuation}"}).api_keys
    assert tuple(key.entry for key in keys) == (
        KEY,
        f"ci:{'x' * 16}",
        punctuation,
    )


def label_on_metrics(bridge: Process) -> str:
    """The label the bridge counts KEY's requests under (one request to an unknown route: no engine needed)."""
    headers = {"x-api-key": KEY}
    assert httpx.get(f"{bridge.url}/v1/no-such-route", headers=headers).status_code == 501
    metrics = httpx.get(f"{bridge.url}/metrics", headers=headers).text
    return re.search(r'bridge_requests_total\{[^}]*key="([^"]+)",route="other",status="501"\}', metrics)[1]


def start(state: Path, log: Path) -> AbstractContextManager[Process]:
    return start_bridge(f"http://127.0.0.1:{free_port()}", log, {"VL_API_KEYS": KEY, "VL_STATE_DIR": str(state)})


@pytest.mark.slow  # two bridge processes, one after the other
def test_an_unnamed_keys_label_is_salted_with_the_pods_secret_and_survives_restarts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with start(state, tmp_path / "first.log") as bridge:
        label = label_on_metrics(bridge)
    salt_file = state / "key-label.salt"
    assert salt_file.is_file() and stat.S_IMODE(salt_file.stat().st_mode) == 0o600
    salt = salt_file.read_bytes()
    assert len(salt) == 32
    assert label == "hmac:" + hmac.new(salt, KEY.encode(), "sha256").hexdigest()[:12]
    assert hashlib.sha256(KEY.encode()).hexdigest()[:12] not in label  # the bare hash: reversible for a weak key
    with start(state, tmp_path / "restarted.log") as bridge:
        assert label_on_metrics(bridge) == label, "the same pod, the same label"
        assert f"key={label}" in bridge.log() and KEY not in bridge.log()
    with start(tmp_path / "another-pod", tmp_path / "other.log") as bridge:
        assert label_on_metrics(bridge) != label, "another pod's salt: another label"
