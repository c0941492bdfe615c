"""build.py as its users run it: render every target, `--check` against hand edits, clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from space import docker_build, targets
from tests.support.repo_copy import ROOT, copy_repo

TARGETS = targets.load_targets()
NAMES = [target.name for target in targets.unique_targets(TARGETS)]


def run_build_py(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "build.py", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return copy_repo(tmp_path / "repo")


@pytest.mark.parametrize("name", NAMES)
def test_every_target_renders_with_its_generated_header(name: str) -> None:
    text = targets.render(TARGETS[name])
    assert text.startswith(f"# GENERATED FILE, DO NOT EDIT: `python build.py --arch {name}` renders it")
    assert "{{" not in text and "{%" not in text
    assert f"--target {name} " in text


def test_every_gpu_family_people_rent_has_a_target_and_a_family_alias() -> None:
    aliases = ("ampere", "ampere-rtx", "ada", "hopper", "blackwell-dc", "blackwell", "cpu")
    assert [TARGETS[alias].name for alias in aliases] == ["sm80", "sm86", "sm89", "sm90", "sm100", "sm120", "cpu"]


@pytest.mark.slow  # starts a Python process
@pytest.mark.parametrize(("alias", "committed"), [("ada", "Dockerfile.ada"), ("blackwell", "Dockerfile.blackwell")])
def test_an_alias_reproduces_the_committed_dockerfile_byte_for_byte(repo: Path, alias: str, committed: str) -> None:
    (repo / committed).unlink()
    result = run_build_py("--arch", alias, cwd=repo)
    assert result.returncode == 0, result.stderr
    assert (repo / committed).read_bytes() == (ROOT / committed).read_bytes()


@pytest.mark.slow  # starts a Python process
def test_all_renders_every_target_and_the_cpu_one_stays_out_of_git(repo: Path) -> None:
    result = run_build_py("--all", cwd=repo)
    assert result.returncode == 0, result.stderr
    assert {line.split()[-1] for line in result.stdout.splitlines()} == {
        "Dockerfile.ampere",
        "Dockerfile.ampere-rtx",
        "Dockerfile.ada",
        "Dockerfile.hopper",
        "Dockerfile.blackwell-dc",
        "Dockerfile.blackwell",
        "build/Dockerfile.cpu",
    }
    ignored = subprocess.run(["git", "check-ignore", "-q", "build/Dockerfile.cpu"], cwd=ROOT)
    assert ignored.returncode == 0


@pytest.mark.slow  # starts a Python process
def test_check_passes_on_the_committed_tree() -> None:
    result = run_build_py("--check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "build.py: the committed Dockerfiles match their rendering\n"


@pytest.mark.slow  # starts a Python process
def test_check_loads_neither_the_docker_sdk_nor_huggingface_hub() -> None:
    """build.py imports space/ whole; space/ imports those two only where it calls them, so `--check` and a
    rendering stay light."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "build.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    loaded = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert {"space.publish", "space.runpod_template"} <= loaded  # what the check below is about was imported
    assert not {name for name in loaded if name.split(".")[0] in ("docker", "huggingface_hub")}


@pytest.mark.slow  # starts a Python process
@pytest.mark.parametrize("committed", ["Dockerfile.ada", "Dockerfile.blackwell"])
def test_check_fails_with_a_diff_after_a_hand_edit(repo: Path, committed: str) -> None:
    dockerfile = repo / committed
    dockerfile.write_text(dockerfile.read_text().replace("EXPOSE 8080 22", "EXPOSE 8080 22 9999"))

    result = run_build_py("--check", cwd=repo)

    assert result.returncode == 1
    assert f"--- {committed} (committed)\n+++ {committed} (rendered)\n" in result.stdout
    assert "-EXPOSE 8080 22 9999\n+EXPOSE 8080 22\n" in result.stdout
    assert result.stderr == "build.py: stale Dockerfile(s): run `python build.py --all` and commit\n"
    assert run_build_py("--all", cwd=repo).returncode == 0
    assert run_build_py("--check", cwd=repo).returncode == 0


@pytest.mark.slow  # starts a Python process
def test_check_fails_when_a_pin_changes_without_a_re_render(repo: Path) -> None:
    versions = repo / "docker" / "versions.toml"
    versions.write_text(versions.read_text().replace('fastokens = "0.3.5"', 'fastokens = "0.3.6"'))

    result = run_build_py("--check", cwd=repo)

    assert result.returncode == 1
    gpu = [name for name in NAMES if TARGETS[name].kind == "gpu"]
    assert result.stdout.count("+      fastokens==0.3.6") == len(gpu) == 6  # every GPU Dockerfile


@pytest.mark.slow  # starts a Python process
def test_an_unknown_arch_is_refused_with_the_choices() -> None:
    result = run_build_py("--arch", "sm75")  # Turing (T4): vLLM's kernels still cover it, no image of ours does
    assert result.returncode == 2
    assert "invalid choice: 'sm75'" in result.stderr and "'hopper'" in result.stderr


@pytest.mark.slow  # starts a Python process
def test_an_invalid_target_table_stops_with_one_line(repo: Path) -> None:
    targets = repo / "docker" / "targets.toml"
    targets.write_text(targets.read_text().replace('kind = "cpu"', 'kind = "tpu"'))

    result = run_build_py("--arch", "sm89", cwd=repo)

    assert result.returncode == 1
    assert result.stderr == "build.py: targets.toml [cpu]: kind='tpu'; allowed: gpu, cpu\n"


@pytest.mark.slow  # starts a Python process
def test_an_undefined_template_value_is_an_error_not_an_empty_string(repo: Path) -> None:
    template = repo / "docker" / "Dockerfile.j2"
    template.write_text(template.read_text().replace("EXPOSE", "EXPOSE {{ admin_port }}"))

    result = run_build_py("--check", cwd=repo)

    assert result.returncode == 1
    assert result.stderr == "build.py: docker/Dockerfile.j2: 'admin_port' is undefined\n"


@pytest.mark.slow  # starts a Python process
def test_build_without_a_docker_engine_says_so_in_one_line(repo: Path, tmp_path: Path) -> None:
    nowhere = f"unix://{tmp_path}/no-docker.sock"

    result = run_build_py("--arch", "cpu", "--build", cwd=repo, env={"DOCKER_HOST": nowhere})

    assert result.returncode == 1
    assert result.stderr == (
        f"build.py: no Docker engine answers at {nowhere}: start one (dockerd) or set DOCKER_HOST\n"
    )


@pytest.mark.slow  # starts a Python process
def test_build_needs_a_target() -> None:
    result = run_build_py("--all", "--build")
    assert result.returncode == 2
    assert "--build, --push, --status, --runpod-template and --runpod need --arch" in result.stderr


def test_a_wheel_directory_is_served_at_the_same_url_on_every_run(tmp_path: Path) -> None:
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"wheel")
    with (
        docker_build.served_directory(tmp_path, "wheels-0") as first,
        docker_build.served_directory(tmp_path, "wheels-0") as second,
    ):
        assert first.url == second.url == f"http://wheels-0:{docker_build.WHEELS_PORT}/"
        assert first.address != second.address and first.address.startswith("127.")
        listing = httpx.get(f"http://{first.address}:{first.port}/", timeout=10)
    assert "torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl" in listing.text
