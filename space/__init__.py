"""What `build.py` does besides reading its command line: render, build, and publish the images.

`targets` renders the Dockerfiles from docker/, `context` lists the files a build needs, `engine`
builds and pushes with the Docker SDK, `hub` publishes through a Hugging Face Docker Space and
`runpod` writes (and, with an API key, saves) the RunPod template. Every module raises `BuildError`
for what the user must fix: its text is the one line build.py prints.
"""


class BuildError(Exception):
    """Something the user must fix; `str()` is the one line that says what (never a secret)."""
