"""`python build.py --verify-deps`: the GPU images' pip layers resolved by pip's real resolver (dry run, for
the image's Python and platform; torch from PyTorch's CUDA index where it answers, else pip's own build) and
the engine's real wheels read for the CUDA runtime and glibc they link. Each check fails on a wrong pin."""

from __future__ import annotations

import copy
import dataclasses
import re
import subprocess
import sys

import pytest

from space import BuildError, deps
from space.pip_index import configured_index
from space.targets import load_targets, load_versions, target_packages
from tests.support.repo_copy import ROOT

# Resolves and downloads the GPU images' vLLM wheels with pip: minutes of waiting on the index, in the side step.
pytestmark = [pytest.mark.vllm, pytest.mark.side]


@pytest.fixture(scope="module")
def verified() -> str:
    """One run for every GPU target, as CI runs it (it fills the cache the other tests reuse)."""
    result = subprocess.run([sys.executable, "build.py", "--all", "--verify-deps"], cwd=ROOT,
                            capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    print("\n" + result.stdout)
    return result.stdout


@pytest.mark.parametrize("target", ["sm80", "sm86", "sm89", "sm90", "sm100", "sm120"])
def test_every_layer_resolves_and_the_engine_links_the_base_s_cuda(verified: str, target: str) -> None:
    """Where PyTorch's index answers, the image's own torch (+cu130) is resolved and its libraries checked;
    where it does not, the run says so first and resolves pip's build of the same version instead."""
    lines = [
        line.removeprefix(f"build.py: {target}: ")
        for line in verified.splitlines()
        if line.startswith(f"build.py: {target}: ")
    ]
    torch_index = target_packages(load_targets()[target], load_versions()).torch_index
    checked_torch = [line for line in lines if line.startswith("torch==")]
    if deps.reachable(torch_index):
        (torch,) = checked_torch
        assert torch.split(":")[0].removeprefix("torch==").endswith("+cu130") and torch.endswith(": ok"), torch
    else:
        said = lines.pop(0)
        assert said.startswith(f"PyTorch's index {torch_index} is unreachable from here: torch is resolved"), said
        assert f" from pip's index {configured_index()} " in said, said
        assert checked_torch == []  # pip's torch is not the image's: its libraries say nothing of the image
    assert [line.split(":")[0] for line in lines[0:3]] == ["torch layer", "engine layer", "runtime layer"]
    assert " GB of wheels (torch==2.13.0" in lines[0] and " GB of wheels (vllm==0.32.0" in lines[1]
    (vllm,) = [line for line in lines if line.startswith("vllm==0.32.0: ")]
    assert "links libcudart.so.13, kernels for sm75, sm80, sm86, sm89, sm90, sm100, sm120," in vllm, vllm
    assert vllm.endswith(": ok"), vllm
    assert "flashinfer-python==0.7.0.post1: no compiled library" in verified and lines[-1] == "dependencies verified"
    assert "build.py: cpu: skipped" in verified


def gpu_versions(**changes: dict) -> dict:
    versions = copy.deepcopy(load_versions())
    for table, values in changes.items():
        versions[table] |= values
    return versions


def test_an_engine_pin_vllm_does_not_take_fails_with_pip_s_own_message(verified: str) -> None:
    """vLLM 0.32.0 pins FlashInfer 0.7.0.post1: the engine layer with 0.7.4 cannot install."""
    with pytest.raises(BuildError, match=r"(?s)pip cannot resolve .*vllm==0\.32\.0 flashinfer-python==0\.7\.4.*"
                                         r"conflicting dependencies"):  # fmt: skip
        deps.verify(load_targets()["sm89"], gpu_versions(engine={"flashinfer-python": "0.7.4"}), print)


def test_an_engine_built_for_another_cuda_than_the_base_s_fails(verified: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The base moved to CUDA 12.8 while vLLM 0.32.0's wheel links CUDA 13's runtime: the image would
    start and fail to load vLLM's kernels on every GPU. (torch from pip's index: the engine is what is read.)"""
    monkeypatch.setattr(deps, "reachable", lambda index: False)
    cu128 = load_versions()["torch-index"]["gpu"].rsplit("/", 1)[0] + "/cu128"
    versions = gpu_versions(cuda={"version": "12.8.1"}, **{"torch-index": {"gpu": cu128}})
    with pytest.raises(
        BuildError,
        match=r"vllm==0\.32\.0: 10 libraries link libcudart\.so\.13 \(vllm/.+\.so…\), but the base has CUDA 12$",
    ):
        deps.verify(load_targets()["sm89"], versions, print)


def test_a_library_needing_a_newer_glibc_than_the_base_s_is_found(verified: str) -> None:
    wheel = next((deps.CACHE / "wheels").glob("vllm-0.32.0-*.whl"))
    found = deps.check_wheel(wheel, "13", "2.17")
    assert len(found.problems) == 1 and re.fullmatch(r"\d+ libraries need up to GLIBC_2\.26 \(vllm/.+\.so…\), "
                                                     r"but the base has glibc 2\.17", found.problems[0]), found  # fmt: skip
    assert deps.check_wheel(wheel, "13", "2.39").problems == []


def test_an_image_for_a_gpu_the_engine_has_no_kernels_for_is_refused(verified: str) -> None:
    """vLLM 0.32.0's own kernels start at Turing: an image for a Volta card (V100, sm70) would load no kernel."""
    volta = dataclasses.replace(load_targets()["sm89"], name="sm70", cuda_arch="7.0")
    with pytest.raises(BuildError, match=r"vllm==0\.32\.0: vllm/_C\w*\.abi3\.so has no kernels for sm70 "
                                         r"\(it has sm75, sm80, sm86, sm89, sm90, sm100, sm120\)$"):  # fmt: skip
        deps.verify(volta, load_versions(), print)
