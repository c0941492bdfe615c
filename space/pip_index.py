"""The package index this machine's pip installs from, as pip itself reads its configuration: what
`--verify-deps` resolves against (and where the tests' image builds, given local wheels, take torch from:
tests/support/docker_engine.py)."""

from __future__ import annotations

import functools
import subprocess
import sys

from space import BuildError

# pip's own option parser, in a process of its own: imported here, pip's internals would load setuptools'
# distutils shim in a way that breaks the next import of setuptools (vLLM's, through torch) in this process.
ASK_PIP = (
    "from pip._internal.commands import create_command; print(create_command('install').parse_args([])[0].index_url)"
)


@functools.cache
def configured_index() -> str:
    """PIP_INDEX_URL, else the index-url of pip's configuration files, else pip's own default index: pip
    decides, so the precedence is pip's (and no index is named here). Asked once a process: every GPU
    target of `--all --verify-deps` reads the same answer."""
    done = subprocess.run([sys.executable, "-c", ASK_PIP], capture_output=True, text=True, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise BuildError(f"pip did not say which index it installs from: {done.stderr.strip()[-300:]}")
    return done.stdout.strip()
