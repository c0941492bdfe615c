"""A builder for the test Hub's Docker Spaces whose image no engine here can build (a GPU target: its CUDA base
cannot be pulled): it says the classic builder's step line for each instruction of the commit's Dockerfile, as the
Hub's build log shows them, and succeeds once someone has read the Space building (a real build takes minutes: its
watcher sees it build). The real build of a real image is space_builder.SpaceBuilder's."""

from __future__ import annotations

import io
import threading

from dockerfile_parse import DockerfileParser

from tests.support.hub_spaces import Build

WATCHED_S = 120.0  # nobody reads the stage: the build ends all the same


class ScriptedBuilder:
    def submit(self, build: Build) -> None:
        threading.Thread(target=self.build, args=(build,), name="scripted-build", daemon=True).start()

    def build(self, build: Build) -> None:
        parsed = DockerfileParser(fileobj=io.BytesIO(build.files["Dockerfile"]))
        steps = [step for step in parsed.structure if step["instruction"] != "COMMENT"]
        for number, step in enumerate(steps, 1):
            build.say(f"Step {number}/{len(steps)} : {step['instruction']} {' '.join(step['value'].split())}")
        build.say(f"Successfully tagged {build.image}:latest")
        build.space.building_read.wait(WATCHED_S)
        build.succeeded()
