"""The image on a Hugging Face Space: the port the Space sends its visitors to (its README's `app_port`), where the
image's builder page answers (runtime/pod/builder_page.py). Standard library only: the build side writes it into
the Space's README (space/hf_space.py), the pod listens on it."""

from __future__ import annotations

SPACE_PORT = 7860  # the Space runs the image on a CPU: the builder page, never the engine
