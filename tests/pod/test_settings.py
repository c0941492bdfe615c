"""Settings: precedence, the one-line errors a bad value gives, and the settings reference (docs/reference/settings.md) kept in sync."""

import subprocess
import sys
import typing
from pathlib import Path

import pytest

from runtime.settings import (
    BY_ENV,
    QUOTED_CHARS,
    VARIABLES,
    Scope,
    Settings,
    SettingsError,
    Variable,
    as_text,
    load_settings,
    quoted,
    unknown_settings,
    with_tables,
)

ROOT = Path(__file__).resolve().parents[2]

BAD_VALUES = [
    (
        "VL_MODEL",
        "gpt5",
        "VL_MODEL='gpt5' is not allowed: expected one of 'codernext', 'flashnext', 'kimi', "
        "'nemotron', 'ornith', 'ornithnvfp4', 'qwen', 'qwen38', 'qwen38nvfp4', 'tiny', 'tiny2'",
    ),
    ("VL_CTX", "128k", "VL_CTX='128k' is not allowed: expected a whole number >= 256, or empty"),
    ("VL_CTX", "100", "VL_CTX='100' is not allowed: expected a whole number >= 256, or empty"),
    ("VL_UTIL", "93", "VL_UTIL='93' is not allowed: expected a number in 0.05..0.99, or empty"),
    ("VL_UTIL", "0,9", "VL_UTIL='0,9' is not allowed: expected a number in 0.05..0.99, or empty"),
    ("VL_KVBYTES", "15GiB", "VL_KVBYTES='15GiB' is not allowed: expected a whole number of bytes >= 1, or empty"),
    ("VL_BATCHED", "8", "VL_BATCHED='8' is not allowed: expected a whole number >= 64, or empty"),
    ("VL_SEQS", "0", "VL_SEQS='0' is not allowed: expected a whole number >= 1, or empty"),
    ("VL_SPEC", "dspark", "VL_SPEC='dspark' is not allowed: expected one of 'auto', 'off', 'ngram', 'mtp'"),
    ("VL_SPEC_N", "64", "VL_SPEC_N='64' is not allowed: expected a whole number in 1..32, or empty"),
    ("VL_TP", "3.5", "VL_TP='3.5' is not allowed: expected a whole number in 1..8, or empty"),
    ("VL_DP", "0", "VL_DP='0' is not allowed: expected a whole number in 1..8"),
    ("VL_MM_IMAGES", "-1", "VL_MM_IMAGES='-1' is not allowed: expected a whole number in 0..64"),
    ("VL_ASYNC", "maybe", "VL_ASYNC='maybe' is not allowed: expected one of 'on', 'off', or empty"),
    ("VL_BRIDGE", "enabled", "VL_BRIDGE='enabled' is not allowed: expected one of 'on', 'off'"),
    ("VL_BRIDGE_PING_S", "0", "VL_BRIDGE_PING_S='0' is not allowed: expected a number of seconds in 1..300"),
    ("VL_BRIDGE_PING_S", "1e-300", "VL_BRIDGE_PING_S='1e-300' is not allowed: expected a number of seconds in 1..300"),
    (
        "VL_LISTEN",
        "0.0.0.0\nPasswordAuthentication yes",
        "VL_LISTEN='0.0.0.0\\nPasswordAuthentication yes' is not "
        "allowed: expected an IPv4 or IPv6 address to listen on",
    ),
    (
        "VL_CONFIG_FILE",
        "../../x",
        "VL_CONFIG_FILE='../../x' is not allowed: expected a relative path inside the config "
        "repo (`a-z A-Z 0-9 _ . -` and `/`; no `..`)",
    ),
    (
        "VL_REPO",
        "--help",
        "VL_REPO='--help' is not allowed: expected a Hub model repo id (owner/name) or the absolute "
        "path of an existing directory, or empty",
    ),
    ("VL_ENGINE_PORT", "70000", "VL_ENGINE_PORT='70000' is not allowed: expected a TCP port"),
    ("VL_CUDA_COMPAT", "force", "VL_CUDA_COMPAT='force' is not allowed: expected one of 'auto', 'on', 'off'"),
]


@pytest.mark.parametrize(("name", "value", "line"), BAD_VALUES, ids=[f"{n}={v}" for n, v, _ in BAD_VALUES])
def test_a_bad_value_gives_one_line_naming_variable_value_and_what_is_allowed(name, value, line):
    with pytest.raises(SettingsError) as caught:
        load_settings({name: value})
    assert str(caught.value) == line
    assert "\n" not in str(caught.value)


@pytest.mark.slow  # starts a Python process
def test_start_up_stops_on_a_bad_value_with_that_line_only():
    result = subprocess.run(
        [sys.executable, "-m", "runtime", "settings"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"VL_UTIL": "0.93x", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert result.stderr == "VL_UTIL='0.93x' is not allowed: expected a number in 0.05..0.99, or empty\n"


def test_environment_wins_over_the_remote_file_which_wins_over_defaults():
    settings = load_settings({"VL_CTX": "65536"}, remote={"VL_CTX": "131072", "VL_SEQS": "8"})
    assert (settings.ctx, settings.sources["ctx"]) == (65536, "env")
    assert (settings.seqs, settings.sources["seqs"]) == (8, "remote")
    assert (settings.model, settings.sources["model"]) == ("nemotron", "default")


def test_empty_means_the_recipe_decides():
    settings = load_settings({"VL_CTX": "", "VL_UTIL": " ", "VL_ASYNC": ""})
    assert (settings.ctx, settings.util, settings.async_) == (None, None, None)


def test_changed_scopes_say_what_a_reload_restarts():
    old = load_settings({})
    assert old.changed_scopes(load_settings({"VL_BRIDGE_PING_S": "5"})) == {Scope.BRIDGE}
    assert old.changed_scopes(load_settings({"VL_CTX": "65536"})) == {Scope.ENGINE}
    assert old.changed_scopes(load_settings({"VL_ALIASES": "opus"})) == {Scope.BRIDGE}
    unbridged = load_settings({"VL_BRIDGE": "off"})  # vLLM serves the aliases itself: it must restart
    assert unbridged.changed_scopes(load_settings({"VL_BRIDGE": "off", "VL_ALIASES": "opus"})) == {
        Scope.BRIDGE,
        Scope.ENGINE,
    }


SETTINGS_DOC = ROOT / "docs" / "reference" / "settings.md"


def test_the_documented_settings_tables_are_up_to_date():
    document = SETTINGS_DOC.read_text()
    assert with_tables(document) == document, "stale: run `python -m runtime settings --update-docs`"


@pytest.mark.slow  # starts a Python process
def test_update_docs_rewrites_only_the_tables(tmp_path):
    copy = tmp_path / "settings.md"
    text = SETTINGS_DOC.read_text()
    begin = text.index("<!-- settings table")
    copy.write_text(text[:begin] + text[begin:].replace("| `VL_CTX` |", "| `VL_CONTEXT` |"))
    subprocess.run([sys.executable, "-m", "runtime", "settings", "--update-docs", str(copy)], cwd=ROOT, check=True)
    assert copy.read_text() == text


# --- every variable against hostile values, generated from the settings table itself ---

# A valid value for each variable whose default is empty: hostile values are built on it, so that
# the hostile part is the only thing wrong with them.
SAMPLES = {
    "VL_REPO": "owner/model", "VL_CTX": "65536", "VL_UTIL": "0.85",
    "VL_KV_OFFLOAD": "64",
    "VL_COST_PER_HOUR": "0.69", "VL_KVBYTES": "8589934592", "VL_KV": "fp8",
    "VL_BATCHED": "8192", "VL_SEQS": "8", "VL_SPEC_N": "3", "VL_LOOK_MIN": "3", "VL_LOOK_MAX": "8", "VL_TP": "2",
    "VL_ASYNC": "on", "VL_ATTN": "FLASH_ATTN", "VL_ALIASES": "sonnet", "VL_EXTRA_ARGS": "--enforce-eager",
    "VL_API_KEYS": "team:key-0123456789abcdef", "VL_ALLOWED_HOSTS": "pod.example.com", "VL_LOG_REPO": "owner/pod-logs", "VL_CONFIG_REPO": "owner/pod-config",
    "VL_KEY_CONCURRENCY": "4", "VL_CACHE_DIR": "/workspace/caches", "VL_IDLE_STOP_MIN": "30", "VL_MAX_SPEND": "20",
    "VL_WORKERS": "https://abc123-8080.proxy.runpod.net", "VL_WORKER_KEY": "sk-worker-0123456789",
    "VL_SWAP": "tiny:tiny,big:qwen", "VL_PRELOAD": "owner/other-model", "VL_DESKTOP_PASSWORD": "a-desktop-secret",
}  # fmt: skip
NEEDS = {"VL_SWAP": {"VL_API_KEYS": SAMPLES["VL_API_KEYS"]}}  # a sample valid only beside another setting
INJECTION = "\nPasswordAuthentication yes"  # what a newline did to sshd_config through VL_LISTEN
NON_FINITE = {"nan": "nan", "inf": "inf", "-inf": "-Infinity", "overflow": "1e999", "10 kB of digits": "9" * 10_240}
KEYS_ONLY_COMPARED = (
    "API keys are only compared with what a client sends: never a path, an argument or a line of a file"
)
NAMES_NEVER_OPENED = "a model name is compared and echoed to clients, never opened as a path"
VLLM_ARGUMENTS = (
    "vLLM's arguments by design, the operator's own command line: split as a shell would "
    "(a newline is a space there) and exec'd without a shell"
)
# Hostile values a variable accepts on purpose, and why each is harmless there.
HARMLESS = {
    ("VL_API_KEYS", "traversal inside"): KEYS_ONLY_COMPARED,
    ("VL_DESKTOP_PASSWORD", "traversal inside"): "a password the desktop's server compares: never a path or a line",
    ("VL_WORKER_KEY", "traversal inside"): "a key the gateway sends in a header: never a path, an argument or a line",
    (
        "VL_ALLOWED_HOSTS",
        "newline",
    ): "a list: a newline separates names like a comma; names are only compared with Host",
    ("VL_ALIASES", "newline"): "a list: a newline separates names like a comma",
    ("VL_ALIASES", "traversal inside"): NAMES_NEVER_OPENED,
    ("VL_EXTRA_ARGS", "newline"): VLLM_ARGUMENTS,
    ("VL_EXTRA_ARGS", "traversal"): VLLM_ARGUMENTS,
    ("VL_EXTRA_ARGS", "traversal inside"): VLLM_ARGUMENTS,
    ("VL_EXTRA_ARGS", "flag"): VLLM_ARGUMENTS,
    ("VL_EXTRA_ARGS", "long flag"): VLLM_ARGUMENTS,
}


def sample(variable: Variable) -> str:
    assert variable.default or variable.env in SAMPLES, f"give {variable.env} a valid value in SAMPLES"
    return variable.default or SAMPLES[variable.env]


def is_numeric(variable: Variable) -> bool:
    value = variable.parser.parse(sample(variable))
    return isinstance(value, int | float) and not isinstance(value, bool)


def hostile_values(variable: Variable) -> dict[str, str]:
    """What an operator's slip or a hostile Hub file could put in `variable`, by kind."""
    valid = sample(variable)
    values = {
        "newline": valid + INJECTION,
        "nul": valid + "\x00",
        "10 kB": valid + "x" * 10_240,
        "traversal": "../../x",
        "traversal inside": valid + "/../../x",
        "flag": "-x",
        "long flag": "--help",
        "escape code": valid + "\x1b]0;owned\x07\x1b[2J",  # retitles and clears the terminal that prints it
    }
    if is_numeric(variable):
        values |= NON_FINITE
        unicode_digits = valid.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))  # Arabic-Indic: int() reads them
        if unicode_digits != valid:
            values["unicode digits"] = unicode_digits
    if variable.default:  # not optional: empty is not a value
        values |= {"empty": "", "blank": "  "}
    return values


HOSTILE = [(v.env, kind, value) for v in VARIABLES for kind, value in hostile_values(v).items()]


@pytest.mark.parametrize("variable", VARIABLES, ids=[v.env for v in VARIABLES])
def test_every_default_and_sample_is_accepted(variable: Variable) -> None:
    load_settings({variable.env: sample(variable)} | NEEDS.get(variable.env, {}))


@pytest.mark.parametrize(("name", "kind", "value"), HOSTILE, ids=[f"{name}-{kind}" for name, kind, _ in HOSTILE])
def test_hostile_values_are_refused_in_one_line_or_harmless(name: str, kind: str, value: str) -> None:
    variable = BY_ENV[name]
    if (name, kind) in HARMLESS:  # accepted, for the reason HARMLESS gives; a list never holds a newline
        parsed = getattr(load_settings({name: value}), variable.attr)
        assert not isinstance(parsed, tuple) or "\n" not in as_text(parsed)
        return
    with pytest.raises(SettingsError) as caught:
        load_settings({name: value})
    shown = "***" if variable.secret else value  # a secret's value is never printed: its reason follows instead
    assert str(caught.value).startswith(f"{name}={quoted(shown)} is not allowed: expected {variable.allowed}")
    assert len(str(caught.value)) < 1000, "a refusal quotes a value cut short"
    assert "\n" not in str(caught.value)


def test_every_harmless_exception_names_a_real_variable_and_kind() -> None:
    known = {(name, kind) for name, kind, _ in HOSTILE}
    assert set(HARMLESS) <= known


def test_refusals_from_the_hub_file_read_the_same() -> None:
    with pytest.raises(SettingsError, match=r"^VL_ALIASES='a\\x00b' is not allowed"):
        load_settings({}, remote={"VL_ALIASES": "a\x00b"})


@pytest.mark.parametrize(("name", "value", "reason"), [
    ("VL_ALIASES", ",".join(f"claude-{i}" for i in range(65)), "65 entries, at most 64"),
    ("VL_ALLOWED_HOSTS", " ".join(f"h{i}.example.com" for i in range(65)), "65 entries, at most 64"),
    ("VL_API_KEYS", ",".join(f"key-{i:04d}-0123456789abcdef" for i in range(129)), "129 entries, at most 128"),
    ("VL_API_KEYS", "k" * 257, "entry 1 has 257 characters"),
    ("VL_MODEL", "x" * 5000, "5,000 characters, at most 4,096"),
    ("VL_ALIASES", "a" * 50_000, "50,000 characters, at most 4,096"),  # before the parser: no 50 kB list is split
])  # fmt: skip
def test_every_value_and_list_is_bounded(name: str, value: str, reason: str) -> None:
    """The bounds that keep a value inside what an exec takes (40,000 aliases once failed the bridge's launch
    with "Argument list too long", after the old bridge had stopped), said in one short line."""
    with pytest.raises(SettingsError) as caught:
        load_settings({name: value})
    assert str(caught.value).endswith(f"; {reason}")
    assert len(str(caught.value)) < 700


def test_a_long_refused_value_is_quoted_cut_short() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({"VL_CTX": "9" * 1_000_000})
    assert str(caught.value).startswith(f"VL_CTX={'9' * QUOTED_CHARS!r}... (1,000,000 characters) is not allowed")


@pytest.mark.parametrize("arguments", [
    "--host 0.0.0.0", "--host=0.0.0.0", "--ho 0.0.0.0", "--port 9", "--api-key k", "--api_key k",
    "--middleware m.M", "--served-model-name claude", "--served_model_name=x", "--uds /tmp/s", "--config c.yaml",
    "--enforce-eager --host 0.0.0.0",
])  # fmt: skip
def test_extra_engine_arguments_cannot_take_what_the_runtime_sets(arguments: str) -> None:
    with pytest.raises(SettingsError, match=r"the runtime's$"):
        load_settings({"VL_EXTRA_ARGS": arguments})


def test_extra_engine_arguments_with_an_escape_code_are_refused_at_validation() -> None:
    with pytest.raises(SettingsError, match=r"a control character \(an escape code\?\) is no argument of vLLM's$"):
        load_settings({"VL_EXTRA_ARGS": "--enforce-eager --seed \x1b[2J1"})


@pytest.mark.parametrize("arguments", ["--enforce-eager", "--max-model-len 4096", "--config-format hf", "--seed -1",
                                       "--chat-template-content-format openai", "--hf-token abc"])  # fmt: skip
def test_extra_engine_arguments_of_vllm_s_own_pass(arguments: str) -> None:
    assert load_settings({"VL_EXTRA_ARGS": arguments}).extra_args == arguments


@pytest.mark.slow  # starts a Python process
def test_a_misspelt_setting_in_the_environment_is_a_warning_naming_the_closest() -> None:
    environ = {"VL_MODLE": "qwen", "VL_CXT": "4096", "VL_SOMETHING_ELSE": "1", "VL_MODEL": "tiny", "OTHER": "x"}
    assert unknown_settings(environ) == [
        "warning: VL_CXT is not a setting (did you mean VL_CTX?); it is ignored",
        "warning: VL_MODLE is not a setting (did you mean VL_MODEL?); it is ignored",
        "warning: VL_SOMETHING_ELSE is not a setting; it is ignored",
    ]
    result = subprocess.run([sys.executable, "-m", "runtime", "settings"], cwd=ROOT, capture_output=True, text=True,
                            env={"VL_MODLE": "qwen", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert result.returncode == 0
    assert result.stderr == "warning: VL_MODLE is not a setting (did you mean VL_MODEL?); it is ignored\n"


@pytest.mark.parametrize(("name", "value", "parsed"), [
    ("VL_LISTEN", " 127.0.0.1 ", "127.0.0.1"),
    ("VL_LISTEN", "0:0::0", "::"),  # canonical: "::" is how the pod recognises "everywhere"
    ("VL_LISTEN", "::1", "::1"),
    ("VL_CONFIG_FILE", "pods/a100.env", "pods/a100.env"),
    ("VL_CONFIG_FILE", ".config/pod.env", ".config/pod.env"),
    ("VL_REPO", "nvidia/Qwen3.8-27B_NVFP4", "nvidia/Qwen3.8-27B_NVFP4"),
    ("VL_LOG_REPO", "datasets/owner/pod-logs", "datasets/owner/pod-logs"),
    ("VL_ALIASES", "claude-sonnet-4-5[1m], us.anthropic.claude-opus-4-v1:0 claude-opus-4-1@20250805",
     ("claude-sonnet-4-5[1m]", "us.anthropic.claude-opus-4-v1:0", "claude-opus-4-1@20250805")),
    ("VL_KV", "fp8_e4m3", "fp8_e4m3"),
    ("VL_BRIDGE_PING_S", "1", 1.0),
    ("VL_UTIL", "0.9", 0.9),
])  # fmt: skip
def test_real_values_still_pass(name: str, value: str, parsed: object) -> None:
    assert getattr(load_settings({name: value}), BY_ENV[name].attr) == parsed


@pytest.mark.parametrize("path", ["../../x", "/etc/passwd", "a//pod.env", "pods/", "./pod.env", "pods\\pod.env", ""])
def test_the_config_file_stays_among_the_repo_files(path: str) -> None:
    """The pod sends its Hub token with the request for this path: traversal, absolute paths, empty
    segments and backslashes (a separator to some servers) are refused."""
    with pytest.raises(SettingsError, match=r"^VL_CONFIG_FILE="):
        load_settings({"VL_CONFIG_FILE": path})


def test_vl_repo_takes_an_existing_directory_only(tmp_path: Path) -> None:
    assert load_settings({"VL_REPO": str(tmp_path)}).repo == str(tmp_path)
    with pytest.raises(SettingsError, match=r"^VL_REPO="):
        load_settings({"VL_REPO": str(tmp_path / "absent")})


@pytest.mark.parametrize("variable", ["VL_SSH_AUTHORIZED_KEYS", "VL_SSH_ENV_FILE"])
@pytest.mark.parametrize("path", ["/etc/passwd", "/etc/shadow", "/etc", "/dev/null"])
def test_a_file_the_runtime_writes_is_never_a_system_file(variable: str, path: str) -> None:
    """Keys are appended to the first and the pod's environment written over the second, as root."""
    with pytest.raises(SettingsError, match=rf"^{variable}='{path}' is not allowed: .*; {path} (exists and )?is not"):
        load_settings({variable: path})


def test_an_authorized_keys_file_passes_with_keys_options_and_comments(tmp_path: Path) -> None:
    keys = tmp_path / "authorized_keys"
    keys.write_text(
        "# team\n\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPxyz alice@laptop\n"
        'from="10.0.0.0/8",no-pty ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ== bob\n'
        "sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29t\n"
    )
    assert load_settings({"VL_SSH_AUTHORIZED_KEYS": str(keys)}).ssh_authorized_keys == str(keys)
    assert load_settings({"VL_SSH_AUTHORIZED_KEYS": str(tmp_path / "absent")}).ssh_authorized_keys
    keys.write_text(keys.read_text() + "root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(SettingsError, match=r"exists and is not an authorized_keys file$"):
        load_settings({"VL_SSH_AUTHORIZED_KEYS": str(keys)})
    keys.unlink()
    keys.symlink_to("/etc/passwd")
    with pytest.raises(SettingsError, match=r"is not a regular file$"):
        load_settings({"VL_SSH_AUTHORIZED_KEYS": str(keys)})


def test_the_environment_file_is_taken_only_when_the_runtime_wrote_it(tmp_path: Path) -> None:
    from runtime.pod.sshd import environment_script

    script = tmp_path / "pod-environment.sh"
    for content in ("", environment_script({"VL_MODEL": "tiny"})):
        script.write_text(content)
        assert load_settings({"VL_SSH_ENV_FILE": str(script)}).ssh_env_file == str(script)
    script.write_text("export PATH=/usr/bin\n")  # someone's profile snippet: not ours to write over
    with pytest.raises(SettingsError, match=r"exists and is not the runtime's$"):
        load_settings({"VL_SSH_ENV_FILE": str(script)})


def test_every_setting_is_a_typed_attribute_of_settings() -> None:
    """A type checker sees each setting: `Settings` declares one annotated attribute per variable, no more."""
    declared = set(typing.get_type_hints(Settings)) - {"sources"}
    assert declared == {variable.attr for variable in VARIABLES}


def test_settings_given_to_a_child_read_back_unchanged() -> None:
    effective = load_settings({"VL_API_KEYS": "ci:key-one-0123456789,key-two-0123456789", "VL_CTX": "4096"})
    assert load_settings(effective.environ()) == effective
