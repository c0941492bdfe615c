"""The Hub settings file judged: what it may set, what it may not, and `python -m runtime settings --check`,
which refuses the same files with the same words as the pod."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runtime.settings import load_settings
from runtime.settingsfile import MAX_FILE_BYTES, FileRefused, SettingsFile, parse_settings_file, settings_with_file
from tests.support.environ import outer_environ
from tests.support.hub_server import HubServer

pytestmark = pytest.mark.slow  # `runtime settings --check` run as a process against the test Hub

ROOT = Path(__file__).resolve().parents[2]
KEY = "team:key-0123456789abcdef"
ALIASES_40K = ",".join(f"claude-{i}" for i in range(40_000))  # 269 KB: once adopted, then "Argument list too long"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("VL_CTX=4096\n", {"VL_CTX": "4096"}),
        ("# a comment\n\n  VL_CTX = 4096  \n", {"VL_CTX": "4096"}),
        ('VL_ALIASES="claude-a, claude-b"', {"VL_ALIASES": "claude-a, claude-b"}),
        ("export VL_SPEC=off", {"VL_SPEC": "off"}),
        ("VL_CTX=4096  # 4k is enough here", {"VL_CTX": "4096"}),
        (
            "VL_EXTRA_ARGS='--chat-template-content-format a #b'",
            {"VL_EXTRA_ARGS": "--chat-template-content-format a #b"},
        ),
        ("VL_API_KEYS=abc#def", {"VL_API_KEYS": "abc#def"}),
        ("VL_KV=", {"VL_KV": ""}),
        ("", {}),
    ],
)
def test_parse_settings_file(text: str, expected: dict[str, str]) -> None:
    assert parse_settings_file(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("VL_CTX 4096", "refused pod.env: line 1: expected VL_NAME=value, got 'VL_CTX 4096'"),
        ("# ok\nVL CTX=1", "refused pod.env: line 2: expected VL_NAME=value, got 'VL CTX=1'"),
        ("=4096", "refused pod.env: line 1: expected VL_NAME=value, got '=4096'"),
        ("VL_CTX=1\nVL_CTX=2", "refused pod.env: line 2: VL_CTX is already set on line 1"),
        ('VL_ALIASES="a, b', 'refused pod.env: line 1: the quote opened by " is not closed at the end of the line'),
        ("VL_API_KEYS sk-secret-0123456789", "refused pod.env: line 1: expected VL_NAME=value, got 'VL_API_KEYS ...'"),
    ],
)
def test_parse_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(FileRefused) as error:
        parse_settings_file(text)
    assert str(error.value) == message


def judge(text: str, private: bool | None = True, **environ: str) -> str:
    """The refusal the pod gives for `text` at start on `environ` (it must refuse)."""
    with pytest.raises(FileRefused) as refusal:
        settings_with_file(load_settings(environ), environ, SettingsFile(text, "o/c/pod.env", private))
    return str(refusal.value)


def test_a_valid_file_applies_under_the_environment() -> None:
    environ = {"VL_CTX": "8192"}
    file = SettingsFile("VL_BRIDGE_PING_S=5\nVL_CTX=4096\nVL_MODEL=tiny\n", "o/c/pod.env", private=False)
    settings = settings_with_file(load_settings(environ), environ, file)
    assert (settings.bridge_ping_s, settings.model, settings.ctx) == (5.0, "tiny", 8192)
    assert (settings.sources["bridge_ping_s"], settings.sources["ctx"]) == ("remote", "env")


def test_pod_settings_are_refused_naming_each() -> None:
    assert judge("VL_CTX=4096\nVL_PORT=9000\nVL_STATE_DIR=/srv/elsewhere\n") == (
        "refused o/c/pod.env: VL_PORT, VL_STATE_DIR are pod settings: set them in the pod's environment "
        "(the RunPod template)"
    )
    assert judge("VL_LOG_REPO=someone/else\n").endswith(
        ": VL_LOG_REPO is a pod setting: set it in the pod's environment (the RunPod template)"
    )


def test_every_reason_is_given_at_once_in_the_file_s_order() -> None:
    assert judge("VL_SPEC=banana\nVL_MODLE=qwen\nVL_CTX=lots\n") == (
        "refused o/c/pod.env: VL_SPEC='banana' is not allowed: expected one of 'auto', 'off', 'ngram', 'mtp'; "
        "VL_MODLE is not a setting (did you mean VL_MODEL?); "
        "VL_CTX='lots' is not allowed: expected a whole number >= 256, or empty"
    )


def test_secrets_are_refused_from_a_public_repo_and_taken_from_a_private_one() -> None:
    assert judge(f"VL_API_KEYS={KEY}\n", private=False) == (
        "refused o/c/pod.env: VL_API_KEYS is a secret and this repo is public: set it in the pod's environment, "
        "or keep the file in a private repo"
    )
    rotated = settings_with_file(load_settings({}), {}, SettingsFile(f"VL_API_KEYS={KEY}\n", "o/c/pod.env", True))
    assert [key.name for key in rotated.api_keys] == ["team"]


@pytest.mark.parametrize("text", ["VL_API_KEYS=\n", "VL_ALIASES=x\n", ""], ids=["emptied", "line removed", "deleted"])
def test_a_file_cannot_open_a_keyed_pod(text: str) -> None:
    keyed = settings_with_file(load_settings({}), {}, SettingsFile(f"VL_API_KEYS={KEY}\n", "o/c/pod.env", True))
    with pytest.raises(
        FileRefused, match=r": the pod has keys, and this file would leave VL_API_KEYS empty, the pod open"
    ):
        settings_with_file(keyed, {}, SettingsFile(text, "o/c/pod.env", True))


def test_values_that_do_not_go_together_refuse_the_file_in_one_line() -> None:
    """A dollar budget on a pod without VL_COST_PER_HOUR: the file refused as any other (the start and the live reload
    serve on), never an error escaping its judging; with the price in the pod's environment, taken."""
    budgeted = f"VL_API_KEYS={KEY}:5usd/day\n"
    assert judge(budgeted, private=True) == (
        "refused o/c/pod.env: VL_COST_PER_HOUR='' is not allowed: expected the pod's price an hour while VL_API_KEYS "
        "gives team a budget in dollars"
    )
    priced = settings_with_file(
        load_settings({}), {"VL_COST_PER_HOUR": "2.5"}, SettingsFile(budgeted, "o/c/pod.env", True)
    )
    assert [budget.entry for key in priced.api_keys for budget in key.budgets] == ["5usd/day"]


def test_an_open_pod_stays_open_with_a_file_without_keys() -> None:
    assert settings_with_file(load_settings({}), {}, SettingsFile("VL_API_KEYS=\n", "o/c/pod.env", True)).api_keys == ()


def test_a_file_too_large_is_refused_unread_and_a_long_value_is_quoted_short() -> None:
    assert judge(f"VL_ALIASES={ALIASES_40K}\n") == (
        f"refused o/c/pod.env: {len(ALIASES_40K) + 12:,} bytes, at most {MAX_FILE_BYTES:,} (a file of VL_NAME=value lines)"
    )
    refusal = judge(f"VL_CTX={'9' * 60_000}\n")
    assert len(refusal) < 400 and "(60,000 characters)" in refusal


def test_a_refusal_names_ten_problems_and_counts_the_others() -> None:
    refusal = judge("".join(f"VL_NOPE_{i}=1\n" for i in range(25)))
    assert refusal.count("is not a setting") == 10 and refusal.endswith("; and 15 more")


# --- python -m runtime settings --check ---------------------------------------------------------


def check(path: Path, *args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "settings", "--check", str(path), *args],
        cwd=ROOT, env=outer_environ() | environ, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_check_accepts_a_valid_file(tmp_path: Path) -> None:
    (tmp_path / "pod.env").write_text("VL_CTX=4096\nVL_ALIASES=claude-x\n")
    result = check(tmp_path / "pod.env")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith(f"accepted {tmp_path / 'pod.env'}: it changes bridge, engine over this environment")


def test_check_refuses_as_the_pod_does(tmp_path: Path) -> None:
    text = "VL_PORT=9000\nVL_ALIASES=" + ",".join(f"c{i}" for i in range(65)) + "\nVL_EXTRA_ARGS='--host 0.0.0.0'\n"
    (tmp_path / "pod.env").write_text(text)
    result = check(tmp_path / "pod.env")
    assert result.returncode == 1
    assert result.stderr == judge(text).replace("o/c/pod.env", str(tmp_path / "pod.env")) + "\n"
    assert (
        "VL_EXTRA_ARGS='--host 0.0.0.0' is not allowed" in result.stderr and "--host is the runtime's" in result.stderr
    )


def test_check_refuses_values_that_do_not_go_together_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "pod.env").write_text(f"VL_API_KEYS={KEY}:5usd/day\n")
    result = check(tmp_path / "pod.env")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"refused {tmp_path / 'pod.env'}: VL_COST_PER_HOUR='' is not allowed: expected the pod's price an hour while "
        "VL_API_KEYS gives team a budget in dollars\n"
    )


def test_check_with_a_repo_asks_the_hub_whether_secrets_may_be_there(tmp_path: Path, hub_server: HubServer) -> None:
    hub_server.create_repo("pod-owner/public-config", private=False)
    hub_server.create_repo("pod-owner/private-config", private=True)
    (tmp_path / "pod.env").write_text(f"VL_API_KEYS={KEY}\n")
    public = check(tmp_path / "pod.env", "--repo", "pod-owner/public-config", **hub_server.env())
    assert public.returncode == 1
    assert public.stderr == (
        "refused pod-owner/public-config/pod.env: VL_API_KEYS is a secret and this repo is public: set it in the "
        "pod's environment, or keep the file in a private repo\n"
    )
    private = check(tmp_path / "pod.env", "--repo", "pod-owner/private-config", **hub_server.env())
    assert private.returncode == 0 and private.stdout.startswith("accepted pod-owner/private-config/pod.env")
    unknown = check(tmp_path / "pod.env", "--repo", "pod-owner/absent", **hub_server.env())
    assert unknown.returncode == 2
    assert unknown.stderr.startswith(f"cannot check {tmp_path / 'pod.env'}: the Hub does not say whether ")


def test_check_warns_of_a_misspelt_setting_in_the_environment(tmp_path: Path) -> None:
    (tmp_path / "pod.env").write_text("VL_CTX=4096\n")
    result = check(tmp_path / "pod.env", VL_MODLE="qwen")
    assert result.returncode == 0
    assert result.stderr == "warning: VL_MODLE is not a setting (did you mean VL_MODEL?); it is ignored\n"
