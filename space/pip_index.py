"""The package index this machine's pip installs from, as pip itself reads its configuration: what
`--verify-deps` resolves against, and where a build given local wheels takes torch from."""

from __future__ import annotations


def configured_index() -> str:
    """PIP_INDEX_URL, else the index-url of pip's configuration files, else pip's own default index: pip's
    option parser decides, so the precedence is pip's (and no index is named here)."""
    from pip._internal.commands import create_command

    options, _ = create_command("install").parse_args([])
    return str(options.index_url)
