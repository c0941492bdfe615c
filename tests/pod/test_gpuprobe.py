"""A sick host found by probing its GPUs, without a GPU: the probes run as on a pod (subprocesses with deadlines),
with an `nvidia-smi` and a `dmesg` that print outputs in the shapes NVIDIA's 570 driver prints them, and an engine
Python whose torch stands in for CUDA alone (tests/support/fakegpu.py). These outputs were composed from NVIDIA's
documentation and published outputs of sick hosts, not captured on one here: only a real sick GPU proves the rest."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from runtime.gpuprobe import examine, run_bounded
from tests.support.fakegpu import fake_engine_python, fake_nvidia_smi

pytestmark = pytest.mark.slow  # each probe is a subprocess

CLEAN_L, CLEAN_Q = "smi-L-570.133.20-8xh100.txt", "smi-q-570.133.20-8xh100.txt"


def probe(tmp_path: Path, listing=CLEAN_L, query=CLEAN_Q, kernel_log=None, devices=8, faults=None, **kwargs):
    bin_dir = fake_nvidia_smi(tmp_path / "bin", listing, query, kernel_log, kwargs.pop("hang", False))
    python = fake_engine_python(tmp_path / "venv", devices, faults) if devices is not None else None
    return examine(python, {"PATH": f"{bin_dir}:/usr/bin:/bin", **kwargs.pop("env", {})}, **kwargs)


def test_a_sound_host_passes_every_probe(tmp_path: Path) -> None:
    health = probe(tmp_path)
    assert (health.sick, health.suspect) == ((), ())
    assert health.summary() == "no fault (nvidia-smi: 8 GPUs; a CUDA probe on 8 devices)"


def test_a_gpu_the_driver_lists_but_cuda_does_not_see_makes_the_host_sick(tmp_path: Path) -> None:
    assert probe(tmp_path, devices=7).sick == ("nvidia-smi lists 8 GPUs but CUDA sees 7",)
    # CUDA_VISIBLE_DEVICES picks fewer on purpose: no fault.
    assert probe(tmp_path, devices=2, env={"CUDA_VISIBLE_DEVICES": "0,1"}).sick == ()


def test_a_gpu_the_driver_cannot_reach_makes_the_host_sick(tmp_path: Path) -> None:
    health = probe(tmp_path, listing="smi-L-570.133.20-8xh100-lost.txt", devices=7)
    assert health.sick == (
        "the driver cannot reach the GPU at 0000:5D:00.0 (Unknown Error)",
        "nvidia-smi lists 8 GPUs but CUDA sees 7",
    )


def test_a_driver_asking_for_a_reset_makes_the_host_sick(tmp_path: Path) -> None:
    health = probe(tmp_path, query="smi-q-570.133.20-8xh100-reset.txt")
    assert health.sick == ("GPU 00000000:5D:00.0 asks for Reset (GPU Recovery Action)",)


def test_ecc_errors_and_a_row_waiting_for_a_reset_are_suspect_not_sick(tmp_path: Path) -> None:
    """The GPU serves (its faulty row is contained): only a CUDA fault they corroborate calls the host sick."""
    health = probe(tmp_path, query="smi-q-570.133.20-8xh100-remap.txt")
    assert health.sick == ()
    assert health.suspect == (
        "GPU 00000000:AB:00.0 had 2 uncorrectable ECC errors since the driver loaded "
        "(ECC Errors / Volatile / DRAM Uncorrectable)",
        "GPU 00000000:AB:00.0 has a remapped memory row waiting for a reset (Remapped Rows Pending: Yes)",
    )


def test_the_kernel_logs_hardware_xids_on_this_pods_gpus_are_suspect(tmp_path: Path) -> None:
    """Xid 79 and 154 on one of its GPUs count; Xid 79 on another tenant's GPU (0000:c1:00) does not, nor Xid 31 or
    13, which an application's own illegal address raises."""
    assert probe(tmp_path, kernel_log="dmesg-xid79.txt").suspect == (
        "Xid 79 on 0000:5d:00 (GPU has fallen off the bus)",
        "Xid 154 on 0000:5d:00 (GPU recovery action changed)",
    )
    assert probe(tmp_path, kernel_log="dmesg-xid31.txt").evidence == ()


@pytest.mark.parametrize(
    ("faults", "sick"),
    [
        (
            {3: "CUDA error: an illegal memory access was encountered"},
            ("GPU 3 failed the CUDA probe: RuntimeError: CUDA error: an illegal memory access was encountered",),
        ),
        ({6: "wrong"}, ("GPU 6 failed the CUDA probe: a matmul gave 16777215.0",)),
        ({5: "hang"}, ("GPU 5 did not answer the CUDA probe within 3 s",)),
        ({2: "CUDA out of memory. Tried to allocate 2.00 MiB"}, ()),  # a process still holds it: not the host
    ],
)
def test_the_cuda_probe_names_the_device_that_fails_hangs_or_computes_wrong(
    tmp_path: Path, faults: dict[int, str], sick: tuple[str, ...]
) -> None:
    started = time.monotonic()
    assert probe(tmp_path, faults=faults, cuda_deadline_s=3).sick == sick
    assert time.monotonic() - started < 10


def test_cuda_that_cannot_be_initialised_makes_the_host_sick_but_a_broken_torch_does_not(tmp_path: Path) -> None:
    env = {"PATH": str(fake_nvidia_smi(tmp_path / "bin", CLEAN_L, CLEAN_Q))}
    python = fake_engine_python(tmp_path / "venv", 8, init_error="CUDA driver error: unknown error")
    assert examine(python, env).sick == (
        "CUDA could not be initialised: RuntimeError: CUDA driver error: unknown error",
    )
    fake_engine_python(tmp_path / "venv", 8, init_error="libtorch_python.so: cannot open shared object file")
    assert examine(python, env).evidence == ()  # the image's fault, not the host's: said by the engine's own start


def test_without_torch_or_nvidia_smi_the_probes_say_nothing_rather_than_guess(tmp_path: Path) -> None:
    fake_engine_python(tmp_path / "venv", 0, torch=False)
    health = examine(
        tmp_path / "venv" / "bin" / "python", {"PATH": str(fake_nvidia_smi(tmp_path / "b", CLEAN_L, None))}
    )
    assert (health.evidence, health.checked) == ((), ("nvidia-smi: 8 GPUs",))  # no CUDA count to compare
    empty = examine(tmp_path / "absent" / "python", {"PATH": str(tmp_path / "nowhere")})
    assert empty.summary() == "no fault (nothing could be checked)"


def test_a_hung_nvidia_smi_is_itself_the_verdict_within_its_deadline(tmp_path: Path) -> None:
    started = time.monotonic()
    health = probe(tmp_path, hang=True, devices=None, smi_deadline_s=1)
    assert health.sick == ("nvidia-smi -L did not answer within 1 s", "nvidia-smi -q did not answer within 1 s")
    assert time.monotonic() - started < 8


def test_a_probe_that_prints_without_end_is_read_up_to_its_cap_and_killed() -> None:
    started = time.monotonic()
    ran = run_bounded([sys.executable, "-c", "while True: print('x' * 1000)"], 30, cap=100_000)
    assert len(ran.text) == 100_000 and time.monotonic() - started < 5
