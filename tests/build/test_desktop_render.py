"""The browser desktop's image layer (docker/targets.toml `desktop`), as rendered: its own apt layer right
after the OS one (both change rarely), clean like it, and absent from a target that turns it off."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from space import BuildError, targets

TARGETS = targets.load_targets()
VERSIONS = targets.load_versions()
WITH_DESKTOP = [target.name for target in targets.unique_targets(TARGETS) if target.desktop]  # all, today


def runs(target: targets.Target) -> list[str]:
    parser = DockerfileParser(fileobj=io.BytesIO(targets.render(target, VERSIONS).encode()), env_replace=False)
    return [item["value"] for item in parser.structure if item["instruction"] == "RUN"]


@pytest.mark.parametrize("name", WITH_DESKTOP)
def test_the_desktop_is_a_layer_of_its_own_right_after_the_os_packages(name: str) -> None:
    commands = runs(TARGETS[name])
    installs = [i for i, run in enumerate(commands) if "apt-get install" in run]
    assert len(installs) == 2
    base, layer = (commands[i] for i in installs)
    assert "openssh-server" in base and installs[1] == installs[0] + 1  # nothing faster-changing between them
    assert commands.index(next(run for run in commands if "-m venv /opt/venv" in run)) > installs[1]
    for package in ("tigervnc-standalone-server", "tigervnc-tools", "jwm", "xterm", "python3-websockify"):
        assert re.search(rf"\s{re.escape(package)}\s", layer), package
    assert "apt-get download -o APT::Sandbox::User=root novnc" in layer  # the page, not its dependencies
    assert "apt-get clean" in layer and layer.endswith("rm -rf /var/lib/apt/lists/*")
    assert f"{targets.NOVNC_DIR}/index.html" in layer


def test_a_target_without_it_renders_as_before() -> None:
    cpu = dataclasses.replace(TARGETS["cpu"], desktop=False)
    commands = runs(cpu)
    assert sum("apt-get install" in run for run in commands) == 1
    assert not any("jwm" in run or "novnc" in run for run in commands)


def test_the_key_must_be_a_boolean(tmp_path: Path) -> None:
    table = tmp_path / "targets.toml"
    text = (targets.DOCKER_DIR / "targets.toml").read_text()
    table.write_text(text.replace("desktop = true", 'desktop = "yes"', 1))
    with pytest.raises(BuildError, match=r"^targets.toml \[sm80\]: desktop='yes'; expected true or false$"):
        targets.load_targets(table)
    table.write_text(text.replace("desktop = true\n", "", 1))
    with pytest.raises(BuildError, match=r"missing keys \['desktop'\]"):
        targets.load_targets(table)
