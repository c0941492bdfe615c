"""What `build.py` does besides reading its command line: render, verify, build, and publish the images.

`targets` renders the Dockerfiles from docker/, `deps` resolves a GPU image's pins without building it
(from the index `pip_index` reads in pip's configuration), `context` lists the files a build needs,
`docker_build` builds and pushes with a Docker daemon, `hf_space` drives a Hugging Face Docker Space,
`publish` publishes a target through either, `runpod` writes (and, with an API key, saves) the RunPod
template and `runpod_template` fills it for the published image. Every module raises `BuildError` for
what the user must fix: its text is the one line build.py prints.
"""


class BuildError(Exception):
    """Something the user must fix; `str()` is the one line that says what (never a secret)."""
