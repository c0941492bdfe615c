"""The GPU/driver verdict on recorded hosts: /proc/driver/nvidia/version and `nvidia-smi -q` as real
535/550/570/580 drivers print them, the compat library as the image's cuda-compat package lays it out."""

from pathlib import Path

import pytest

from runtime.gpu import GpuError, decide, inspect_gpu, read_host
from runtime.settings import load_settings
from tests.support.fakegpu import fake_engine_python, fake_nvidia_smi

DATA = Path(__file__).parents[1] / "data" / "gpu"


@pytest.fixture
def compat(tmp_path) -> Path:
    """What `cuda-compat-13-0` installs: libcuda from the 580 driver, plus its soname links."""
    directory = tmp_path / "compat"
    directory.mkdir()
    (directory / "libcuda.so.580.65.06").write_bytes(b"\x7fELF")
    (directory / "libcuda.so.1").symlink_to("libcuda.so.580.65.06")
    (directory / "libcuda.so").symlink_to("libcuda.so.1")
    return directory


def host(driver: str, smi: str | None):
    """The host as read through the real code path, with the recorded files in place of the real ones."""
    nvidia_smi = ("cat", str(DATA / smi)) if smi else ("/nonexistent/nvidia-smi", "-q")
    return read_host(DATA / f"proc-{driver}.txt", nvidia_smi)


def test_reading_a_550_host_with_two_a40s():
    found = host("550.127.05", "smi-550.127.05-2xa40.txt")
    assert (found.driver, found.cuda, found.gpus) == ("550.127.05", "12.4", ("NVIDIA A40", "NVIDIA A40"))


def test_the_open_kernel_module_string_of_570_and_580_is_read():
    assert host("570.133.20", None).driver == "570.133.20"
    assert host("580.65.06", None).driver == "580.65.06"


def test_without_nvidia_smi_the_cuda_version_comes_from_the_driver_branch():
    found = host("535.183.01", None)
    assert (found.driver, found.cuda, found.gpus) == ("535.183.01", "12.2", ())


def test_no_driver_at_all_is_a_cpu_machine_not_an_error(tmp_path):
    found = read_host(tmp_path / "absent", ("/nonexistent/nvidia-smi",))
    report = decide(found, "13.0")
    assert (report.accelerator, report.compat, report.engine_env({})) == ("cpu", None, {})
    assert report.summary() == "no NVIDIA driver on this machine: CPU only"


def test_a_data_center_gpu_on_an_older_driver_gets_the_compat_library_in_the_engine_env_only(compat):
    report = decide(host("550.127.05", "smi-550.127.05-2xa40.txt"), "13.0", compat)
    assert report.compat == compat and report.compat_driver == "580.65.06"
    assert report.engine_env({"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}) == {
        "LD_LIBRARY_PATH": f"{compat}:/usr/local/nvidia/lib64"
    }
    assert report.summary() == (
        f"2x NVIDIA A40; host driver 550.127.05 (CUDA 12.4); image CUDA 13.0; "
        f"CUDA forward compatibility on ({compat}, libcuda 580.65.06)"
    )


@pytest.mark.parametrize(
    ("driver", "smi"), [("570.133.20", "smi-570.133.20-h100.txt"), ("535.183.01", "smi-535.183.01-a100.txt")]
)
def test_h100_and_a100_on_12x_drivers_use_forward_compatibility(compat, driver, smi):
    assert decide(host(driver, smi), "13.0", compat).compat == compat


def test_a_consumer_gpu_on_an_older_driver_stops_with_one_line_naming_host_image_and_fix(compat):
    with pytest.raises(GpuError) as caught:
        decide(host("550.127.05", "smi-550.127.05-rtx4090.txt"), "13.0", compat)
    assert str(caught.value) == (
        "host driver 550.127.05 runs CUDA 12.4 but this image needs CUDA 13.0 (driver >= 580.65.06), and "
        "NVIDIA GeForce RTX 4090 cannot use CUDA forward compatibility (data-center GPUs only; error 804): "
        'start the pod on a CUDA 13.0 host (RunPod: "allowedCudaVersions": ["13.0"])'
    )


def test_a_workstation_rtx_6000_ada_is_refused_too(compat):
    with pytest.raises(GpuError, match="NVIDIA RTX 6000 Ada Generation cannot use CUDA forward compatibility"):
        decide(host("570.133.20", "smi-570.133.20-rtx6000ada.txt"), "13.0", compat)


def test_the_operator_can_force_or_forbid_forward_compatibility(compat):
    forced = decide(host("570.133.20", "smi-570.133.20-rtx6000ada.txt"), "13.0", compat, mode="on")
    assert forced.compat == compat
    with pytest.raises(GpuError, match="VL_CUDA_COMPAT=off forbids forward compatibility"):
        decide(host("550.127.05", "smi-550.127.05-2xa40.txt"), "13.0", compat, mode="off")


def test_an_image_without_the_compat_library_says_so(tmp_path):
    with pytest.raises(GpuError, match=f"the image has no CUDA compat library in {tmp_path}: start the pod"):
        decide(host("535.183.01", "smi-535.183.01-a100.txt"), "13.0", tmp_path)


def test_a_host_as_new_as_the_image_never_gets_compat_which_would_shadow_it_error_803(compat):
    for driver, smi in [("580.65.06", "smi-580.65.06-rtxpro6000.txt"), ("580.65.06", None)]:
        report = decide(host(driver, smi), "13.0", compat)
        assert report.compat is None and report.engine_env({}) == {}
    # Same major release: minor version compatibility runs a 13.1 image on a 13.0 driver.
    assert decide(host("580.65.06", None), "13.1", compat).compat is None


def test_inspect_reads_the_image_cuda_from_its_marker_and_logs_the_verdict(tmp_path, compat, caplog):
    marker = tmp_path / ".image_prebaked"
    marker.write_text('{"target": "sm89", "cuda": "13.0.1", "vllm": "0.32.0"}')
    settings = load_settings({"VL_PREBAKED_MARKER": str(marker)})
    with caplog.at_level("INFO", logger="runtime.gpu"):
        report = inspect_gpu(
            settings,
            {},
            proc_version=DATA / "proc-550.127.05.txt",
            nvidia_smi=("cat", str(DATA / "smi-550.127.05-2xa40.txt")),
            compat_dir=compat,
        )
    assert report.image_cuda == "13.0" and report.compat == compat
    assert caplog.messages == [f"gpu: {report.summary()}"]


def test_without_a_marker_the_base_images_cuda_version_is_used(tmp_path, compat):
    settings = load_settings({"VL_PREBAKED_MARKER": str(tmp_path / "absent")})
    with pytest.raises(GpuError, match=r"needs CUDA 13\.0"):
        inspect_gpu(
            settings,
            {"CUDA_VERSION": "13.0.1"},
            proc_version=DATA / "proc-550.127.05.txt",
            nvidia_smi=("cat", str(DATA / "smi-550.127.05-rtx4090.txt")),
            compat_dir=compat,
        )


@pytest.mark.parametrize(
    ("smi", "capabilities", "refused"),
    [
        ("smi-535.183.01-a100.txt", "cap-a100.csv", "NVIDIA A100-SXM4-80GB has compute capability 8.0"),
        ("smi-570.133.20-rtx6000ada.txt", "cap-rtx6000ada.csv", None),
        ("smi-570.133.20-rtx6000ada.txt", None, None),  # a driver that cannot say: nothing to check
    ],
)
def test_an_sm89_image_refuses_an_a100_before_its_kernels_are_compiled_for_the_wrong_card(
    tmp_path, compat, smi, capabilities, refused
):
    """The field notes rented A100s too: the sm89 image there would compile FlashInfer's kernels for 8.9 and fail
    mid-start; it stops first, in one line naming the card, both capabilities and the image to start instead."""
    marker = tmp_path / ".image_prebaked"
    marker.write_text('{"target": "sm89", "cuda_arch": "8.9"}')  # its CUDA aside: the driver's verdict is tested above
    settings = load_settings({"VL_PREBAKED_MARKER": str(marker)})
    query = ("cat", str(DATA / capabilities)) if capabilities else ("/nonexistent/nvidia-smi",)
    inspect = lambda: inspect_gpu(  # noqa: E731
        settings,
        {},
        proc_version=DATA / "proc-580.65.06.txt",
        nvidia_smi=("cat", str(DATA / smi)),
        capabilities=query,
        compat_dir=compat,
    )
    if refused is None:
        assert inspect().host.capabilities == (("8.9",) if capabilities else ())
        return
    with pytest.raises(GpuError) as error:
        inspect()
    assert str(error.value) == (
        f"{refused} but this image compiles its kernels for 8.9 (sm89): start an image built for sm80 "
        "(python build.py --arch sm80)"
    )


@pytest.mark.slow  # the probes are subprocesses (nvidia-smi, the engine's Python)
def test_the_pod_refuses_a_sick_host_before_its_engine_starts_in_one_line(tmp_path, compat, caplog):
    """`probe=True` (the pod's start): nvidia-smi lists 8 H100s, the engine venv's torch sees 7; the probes are the
    real ones, with an nvidia-smi printing recorded outputs and a torch standing in for CUDA (tests/support/fakegpu)."""
    bin_dir = fake_nvidia_smi(tmp_path / "bin", "smi-L-570.133.20-8xh100.txt", "smi-q-570.133.20-8xh100.txt")
    settings = load_settings({"VL_PREBAKED_MARKER": str(tmp_path / "absent"), "VL_VENV": str(tmp_path / "venv")})
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    inspect = lambda: inspect_gpu(  # noqa: E731
        settings, environ, proc_version=DATA / "proc-570.133.20.txt", nvidia_smi=("/nonexistent",), probe=True
    )
    fake_engine_python(tmp_path / "venv", 7)
    with pytest.raises(GpuError) as error:
        inspect()
    assert str(error.value) == (
        "this host is sick: recreate the pod (python -m runtime pod replace POD: a new pod lands elsewhere): "
        "nvidia-smi lists 8 GPUs but CUDA sees 7"
    )
    fake_engine_python(tmp_path / "venv", 8)
    with caplog.at_level("INFO", logger="runtime.gpu"):
        assert inspect().accelerator == "cuda"
    assert caplog.messages[-1] == "gpu probes: no fault (nvidia-smi: 8 GPUs; a CUDA probe on 8 devices)"
    # Without probe (`runtime engine`'s command line) or on a CPU machine, nothing is probed.
    fake_engine_python(tmp_path / "venv", 7)
    assert inspect_gpu(settings, environ, proc_version=DATA / "proc-570.133.20.txt", nvidia_smi=("/x",)).host.driver
    assert inspect_gpu(settings, environ, proc_version=tmp_path / "absent", probe=True).accelerator == "cpu"
