"""GPU telemetry (issue 12): `nvidia-smi --query-gpu` read on an Ada (2x L4) and a Blackwell (2x RTX 5090)
machine, a MIG-mode A100 whose utilization is `[N/A]`, a failing nvidia-smi, and no nvidia-smi at all.

The L4 and RTX 5090 files hold what those machines' nvidia-smi showed in public issue threads
(vllm-project/vllm#10156, noonghunna/club-3090#1253; power there in whole watts), written as the CSV
that QUERY asks for; the MIG file is shaped after the `[N/A]` that nvidia-smi prints in MIG mode. Each
file goes through a real process (`cat`) and the same code the bridge runs; in a bridge, through a
stand-in `nvidia-smi` on PATH that answers QUERY's exact arguments only.
"""

from __future__ import annotations

import asyncio
import os
import shlex
from pathlib import Path

import httpx
import pytest

from runtime.bridge.metrics import Metrics
from runtime.telemetry import NO_GPU, QUERY, GpuReading, GpuTelemetry, Sample, parse_query, read_gpus
from tests.support.bridge import pod_status, start_bridge, start_stand_in
from tests.support.polling import wait_until

DATA = Path(__file__).parents[1] / "data" / "gpu"
L4 = DATA / "query-555.42.06-2xl4.csv"
RTX5090 = DATA / "query-610.57.04-2xrtx5090.csv"
MIG = DATA / "query-535.183.01-a100-mig.csv"
NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
KEY = "sk-telemetry-0123456789abcdef"


def read(path: Path) -> Sample:
    return asyncio.run(read_gpus(("cat", str(path))))


def test_an_ada_machine_with_two_l4s():
    assert read(L4) == Sample(
        (
            GpuReading(0, "NVIDIA L4", 100.0, 382.0, 23034.0, 48.0, 31.0),
            GpuReading(1, "NVIDIA L4", 100.0, 386.0, 23034.0, 47.0, 30.0),
        )
    )


def test_a_blackwell_machine_with_two_rtx_5090s():
    assert read(RTX5090) == Sample(
        (
            GpuReading(0, "NVIDIA GeForce RTX 5090", 0.0, 28812.0, 32607.0, 43.0, 99.0),
            GpuReading(1, "NVIDIA GeForce RTX 5090", 0.0, 28860.0, 32607.0, 50.0, 70.0),
        )
    )


def test_a_gpu_in_mig_mode_is_left_out_with_a_note_rather_than_shown_at_zero():
    sample = read(MIG)
    assert [gpu.index for gpu in sample.gpus] == [1]
    assert sample.note == "GPU 0 (NVIDIA A100-SXM4-80GB) reports no utilization or memory (MIG mode?)"


def test_temperature_and_power_a_gpu_does_not_report_are_none():
    sample = parse_query("0, NVIDIA GeForce RTX 4090, 12, 1024, 24564, [N/A], [Not Supported]\n")
    assert sample.gpus == (GpuReading(0, "NVIDIA GeForce RTX 4090", 12.0, 1024.0, 24564.0, None, None),)


def test_without_nvidia_smi_the_machine_has_no_gpu_and_sampling_stops():
    telemetry = GpuTelemetry(argv=("/nonexistent/nvidia-smi", *QUERY[1:]))
    asyncio.run(asyncio.wait_for(telemetry.run(), 30))  # returns: nothing left to sample
    assert telemetry.status() == ([], NO_GPU)
    assert NO_GPU == "no GPU on this machine (nvidia-smi not found)"


def test_a_failing_nvidia_smi_says_its_first_line_and_is_asked_again(tmp_path):
    (tmp_path / "said").write_text(f"\x1b[31m{NO_DRIVER}\nMake sure that the latest NVIDIA driver is installed.\n")
    sample = asyncio.run(read_gpus(("sh", "-c", f"cat {tmp_path / 'said'}; exit 9")))
    assert sample == Sample((), f"nvidia-smi failed: {NO_DRIVER}", final=False)


def test_the_history_keeps_two_minutes_per_gpu():
    telemetry = GpuTelemetry()
    five_090 = read(RTX5090)
    for second in range(0, 132, 2):
        telemetry.record(1000.0 + second, five_090)
    gpus, note = telemetry.status()
    assert note is None and [gpu["index"] for gpu in gpus] == [0, 1]
    assert [point["t"] for point in gpus[1]["history"]] == [1000.0 + s for s in range(10, 132, 2)]
    assert gpus[1]["history"][-1] == {"t": 1130.0, "utilization_pct": 0.0, "memory_used_mib": 28860.0}
    assert {k: v for k, v in gpus[1].items() if k != "history"} == {
        "index": 1, "name": "NVIDIA GeForce RTX 5090", "utilization_pct": 0.0, "memory_used_mib": 28860.0,
        "memory_total_mib": 32607.0, "temperature_c": 50.0, "power_w": 70.0,
    }  # fmt: skip


def test_the_gauges_show_the_latest_sample_only():
    metrics = Metrics(lambda: 0)
    metrics.show_gpus(read(L4).gpus)
    text = metrics.render().decode()
    assert 'vlpod_gpu_utilization_percent{gpu="1",name="NVIDIA L4"} 100.0' in text
    assert sample(text, 'vlpod_gpu_memory_used_bytes{gpu="0",name="NVIDIA L4"}') == 382 * 2**20
    assert 'vlpod_gpu_power_watts{gpu="0",name="NVIDIA L4"} 31.0' in text
    metrics.show_gpus(read(MIG).gpus)
    text = metrics.render().decode()
    assert (
        "NVIDIA L4" not in text and 'vlpod_gpu_temperature_celsius{gpu="1",name="NVIDIA A100-SXM4-80GB"} 61.0' in text
    )


def sample(text: str, series: str) -> float:
    """The value of one series in Prometheus text."""
    return next(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(series + " "))


def fake_nvidia_smi(directory: Path, recording: Path) -> Path:
    """A `nvidia-smi` that prints `recording` when asked QUERY's exact question, and fails otherwise."""
    directory.mkdir()
    script = directory / "nvidia-smi"
    script.write_text(
        f'#!/bin/sh\n[ "$*" = {shlex.quote(" ".join(QUERY[1:]))} ] || exit 2\nexec cat {shlex.quote(str(recording))}\n'
    )
    script.chmod(0o755)
    return directory


@pytest.mark.slow  # a bridge process
def test_a_bridge_samples_its_gpus_in_the_background_into_status_and_metrics(tmp_path):
    path = f"{fake_nvidia_smi(tmp_path / 'bin', RTX5090)}{os.pathsep}{os.environ['PATH']}"
    with (
        start_stand_in(tmp_path / "upstream.log") as upstream,
        start_bridge(upstream.url, tmp_path / "bridge.log", {"PATH": path, "VL_API_KEYS": KEY}) as bridge,
    ):
        found = wait_until(lambda: (gpus := pod_status(bridge.url, KEY)["gpus"]) and len(gpus[0]["history"]) >= 2 and gpus,
                           "a second sample in the history", 30, every_s=0.5)  # fmt: skip
        assert [(gpu["name"], gpu["memory_used_mib"], gpu["power_w"]) for gpu in found] == [
            ("NVIDIA GeForce RTX 5090", 28812.0, 99.0),
            ("NVIDIA GeForce RTX 5090", 28860.0, 70.0),
        ]
        assert pod_status(bridge.url, KEY)["gpu_note"] is None
        metrics = httpx.get(f"{bridge.url}/metrics", headers={"x-api-key": KEY}, timeout=10).text
        assert 'vlpod_gpu_temperature_celsius{gpu="1",name="NVIDIA GeForce RTX 5090"} 50.0' in metrics


@pytest.mark.slow  # a bridge process
def test_a_bridge_without_nvidia_smi_says_there_is_no_gpu(tmp_path):
    (tmp_path / "empty").mkdir()
    with (
        start_stand_in(tmp_path / "upstream.log") as upstream,
        start_bridge(
            upstream.url, tmp_path / "bridge.log", {"PATH": str(tmp_path / "empty"), "VL_API_KEYS": KEY}
        ) as bridge,
    ):
        found = wait_until(lambda: (state := pod_status(bridge.url, KEY))["gpu_note"] != "GPUs not sampled yet" and state,
                           "the first sample", 30, every_s=0.2)  # fmt: skip
        assert (found["gpus"], found["gpu_note"]) == ([], NO_GPU)
        metrics = httpx.get(f"{bridge.url}/metrics", headers={"x-api-key": KEY}, timeout=10).text
        assert [line for line in metrics.splitlines() if line.startswith("vlpod_gpu_")] == []  # no series at all
