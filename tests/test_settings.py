"""Settings: precedence, the one-line errors a bad value gives, and the README table kept in sync."""

import subprocess
import sys
from pathlib import Path

import pytest

from runtime.settings import Scope, SettingsError, load_settings, readme_with_table

ROOT = Path(__file__).resolve().parent.parent

BAD_VALUES = [
    ("VL_MODEL", "gpt5", "VL_MODEL='gpt5' is not allowed: expected one of 'codernext', 'flashnext', 'kimi', "
     "'nemotron', 'ornith', 'ornithnvfp4', 'qwen', 'qwen38', 'tiny'"),
    ("VL_CTX", "128k", "VL_CTX='128k' is not allowed: expected a whole number >= 256, or empty"),
    ("VL_CTX", "100", "VL_CTX='100' is not allowed: expected a whole number >= 256, or empty"),
    ("VL_UTIL", "93", "VL_UTIL='93' is not allowed: expected a number in 0.05..0.99, or empty"),
    ("VL_UTIL", "0,9", "VL_UTIL='0,9' is not allowed: expected a number in 0.05..0.99, or empty"),
    ("VL_KVBYTES", "15GiB", "VL_KVBYTES='15GiB' is not allowed: expected a whole number of bytes, or empty"),
    ("VL_BATCHED", "8", "VL_BATCHED='8' is not allowed: expected a whole number >= 64, or empty"),
    ("VL_SEQS", "0", "VL_SEQS='0' is not allowed: expected a whole number >= 1, or empty"),
    ("VL_SPEC", "dspark", "VL_SPEC='dspark' is not allowed: expected one of 'auto', 'off', 'ngram', 'mtp'"),
    ("VL_SPEC_N", "64", "VL_SPEC_N='64' is not allowed: expected a whole number in 1..32, or empty"),
    ("VL_TP", "3.5", "VL_TP='3.5' is not allowed: expected a whole number in 1..8, or empty"),
    ("VL_DP", "0", "VL_DP='0' is not allowed: expected a whole number in 1..8"),
    ("VL_MM_IMAGES", "-1", "VL_MM_IMAGES='-1' is not allowed: expected a whole number in 0..64"),
    ("VL_ASYNC", "maybe", "VL_ASYNC='maybe' is not allowed: expected on, off, or empty"),
    ("VL_BRIDGE", "enabled", "VL_BRIDGE='enabled' is not allowed: expected one of 'on', 'off'"),
    ("VL_BRIDGE_PING_S", "0", "VL_BRIDGE_PING_S='0' is not allowed: expected a number of seconds in (0, 300]"),
    ("VL_ENGINE_PORT", "70000", "VL_ENGINE_PORT='70000' is not allowed: expected a TCP port"),
    ("VL_CUDA_COMPAT", "force", "VL_CUDA_COMPAT='force' is not allowed: expected one of 'auto', 'on', 'off'"),
]


@pytest.mark.parametrize(("name", "value", "line"), BAD_VALUES, ids=[f"{n}={v}" for n, v, _ in BAD_VALUES])
def test_a_bad_value_gives_one_line_naming_variable_value_and_what_is_allowed(name, value, line):
    with pytest.raises(SettingsError) as caught:
        load_settings({name: value})
    assert str(caught.value) == line
    assert "\n" not in str(caught.value)


def test_start_up_stops_on_a_bad_value_with_that_line_only():
    result = subprocess.run([sys.executable, "-m", "runtime", "settings"], cwd=ROOT, capture_output=True, text=True,
                            env={"VL_UTIL": "0.93x", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert result.stderr == "VL_UTIL='0.93x' is not allowed: expected a number in 0.05..0.99, or empty\n"


def test_environment_wins_over_the_remote_file_which_wins_over_defaults():
    settings = load_settings({"VL_CTX": "65536"}, remote={"VL_CTX": "131072", "VL_SEQS": "8"})
    assert (settings.ctx, settings.sources["ctx"]) == (65536, "env")
    assert (settings.seqs, settings.sources["seqs"]) == (8, "remote")
    assert (settings.model, settings.sources["model"]) == ("nemotron", "default")


def test_a_typo_in_the_remote_file_is_refused():
    with pytest.raises(SettingsError, match="^VL_CXT='65536' is not allowed: expected a known setting name"):
        load_settings({}, remote={"VL_CXT": "65536"})


def test_empty_means_the_recipe_decides():
    settings = load_settings({"VL_CTX": "", "VL_UTIL": " ", "VL_ASYNC": ""})
    assert (settings.ctx, settings.util, settings.async_) == (None, None, None)


def test_changed_scopes_say_what_a_reload_restarts():
    old = load_settings({})
    assert old.changed_scopes(load_settings({"VL_BRIDGE_PING_S": "5"})) == {Scope.BRIDGE}
    assert old.changed_scopes(load_settings({"VL_CTX": "65536"})) == {Scope.ENGINE}
    assert old.changed_scopes(load_settings({"VL_ALIASES": "opus"})) == {Scope.BRIDGE}
    unbridged = load_settings({"VL_BRIDGE": "off"})  # vLLM serves the aliases itself: it must restart
    assert unbridged.changed_scopes(load_settings({"VL_BRIDGE": "off", "VL_ALIASES": "opus"})) == {Scope.BRIDGE, Scope.ENGINE}


def test_the_readme_settings_table_is_up_to_date():
    readme = (ROOT / "README.md").read_text()
    assert readme_with_table(readme) == readme, "stale: run `python -m runtime settings --update-readme`"


def test_update_readme_rewrites_only_the_table(tmp_path):
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    begin = text.index("<!-- settings table")
    readme.write_text(text[:begin] + text[begin:].replace("| `VL_CTX` |", "| `VL_CONTEXT` |"))
    subprocess.run([sys.executable, "-m", "runtime", "settings", "--update-readme", str(readme)], cwd=ROOT, check=True)
    assert readme.read_text() == text
