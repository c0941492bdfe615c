"""The RunPod template with the browser desktop: port 6080 exactly when its environment turns the desktop on,
the password by reference to a RunPod secret, and a body RunPod's API accepts."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from space import BuildError, runpod, runpod_template
from space.publish import Published
from space.targets import load_targets
from tests.support.repo_copy import ROOT

if TYPE_CHECKING:
    from tests.support.runpod_server import OpenAPISchemas

IMAGE = "docker.io/someone/vllm-pod-sm89:latest"
PLAIN = runpod.template_body("vllm-pod sm89 someone/vllm-pod", IMAGE)


def test_a_template_has_no_desktop_port_unless_its_environment_turns_the_desktop_on() -> None:
    assert runpod_template.DESKTOP_PORT not in PLAIN["ports"] and "VL_DESKTOP" not in PLAIN["env"]
    on = runpod_template.with_desktop(PLAIN)
    assert on["ports"] == [*PLAIN["ports"], "6080/http"]
    assert on["env"]["VL_DESKTOP"] == "on"
    assert on["env"]["VL_DESKTOP_PASSWORD"] == "{{ RUNPOD_SECRET_VL_DESKTOP_PASSWORD }}"  # never a value
    assert runpod_template.with_desktop(on)["ports"].count("6080/http") == 1
    off = {**on["env"], "VL_DESKTOP": "off"}
    assert runpod_template.desktop_ports(on["ports"], off) == PLAIN["ports"]


def test_the_template_with_the_desktop_is_a_valid_request(runpod_openapi: OpenAPISchemas) -> None:
    on = runpod_template.with_desktop(PLAIN)
    assert runpod_openapi.errors("CreateTemplateRequest", on) == []
    assert runpod_openapi.errors("UpdateTemplateRequest", on) == []


def choice(desktop: bool) -> runpod_template.TemplateChoice:
    return runpod_template.TemplateChoice(
        log_repo="datasets/someone/vllm-pod-logs",
        config_repo=None,
        cost_per_hour=None,
        save=False,
        create_log_repo=False,
        desktop=desktop,
    )


def printed_body(text: str) -> dict:
    start = text.index("{")
    return json.loads(text[start : text.index("\n}\n", start) + 2])


def test_build_pys_template_asks_for_the_desktops_secret(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    target = load_targets()["sm89"]
    runpod_template.show_template(target, Published(IMAGE, "someone/vllm-pod"), choice(True), print)
    out = capsys.readouterr().out
    assert printed_body(out)["ports"] == ["8080/http", "22/tcp", "6080/http"]
    assert "Create the secret VL_DESKTOP_PASSWORD too" in out
    runpod_template.show_template(target, Published(IMAGE, "someone/vllm-pod"), choice(False), print)
    out = capsys.readouterr().out
    assert "6080" not in out and "VL_DESKTOP" not in out


def test_an_image_without_the_desktop_gets_no_desktop_template() -> None:
    bare = dataclasses.replace(load_targets()["sm89"], desktop=False)
    with pytest.raises(BuildError, match=r"^the sm89 image has no desktop \(docker/targets.toml: desktop = false\)$"):
        runpod_template.show_template(bare, Published(IMAGE, "someone/vllm-pod"), choice(True), print)


@pytest.mark.slow  # build.py in a process of its own, as a user runs it
def test_build_py_desktop_prints_the_template_with_port_6080_and_no_password(tmp_path: Path) -> None:
    argv = [sys.executable, str(ROOT / "build.py"), "--arch", "ada", "--runpod-template", "--desktop",
            "--registry", "registry.example.com/team/vllm-pod:sm89"]  # fmt: skip
    env = {key: value for key, value in os.environ.items() if key != "HF_TOKEN"}
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    body = printed_body(done.stdout)
    assert body["ports"][-1] == "6080/http"
    assert body["env"]["VL_DESKTOP_PASSWORD"] == "{{ RUNPOD_SECRET_VL_DESKTOP_PASSWORD }}"
