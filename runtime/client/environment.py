"""Claude Code's environment for an endpoint that serves it, printed for bash and PowerShell (`connect`, and `pod up`
once its pod serves): a bare model id (Claude Code honours `CLAUDE_CODE_MAX_CONTEXT_TOKENS` only for ids that do not
start with `claude-`), and `ANTHROPIC_API_KEY` removed (it wins over the token and silently goes to the paid API)."""

from __future__ import annotations

import shlex

from runtime.checks.endpoint import Endpoint
from runtime.logsafe import strip_controls


def claude_environment(endpoint: Endpoint) -> dict[str, str]:
    """The variables that point Claude Code at the endpoint, every model tier on the served model."""
    environment = {
        "ANTHROPIC_BASE_URL": endpoint.base_url,
        "ANTHROPIC_AUTH_TOKEN": endpoint.key,
        "ANTHROPIC_MODEL": endpoint.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": endpoint.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": endpoint.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": endpoint.model,
        "ANTHROPIC_SMALL_FAST_MODEL": endpoint.model,
        # Without these two, Claude Code assumes 200k for an unknown id and compacts there.
        "CLAUDE_CODE_DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT": "1",
        # Each request says its class (main, subagent, compaction…): the console's per-agent view shows it.
        "CLAUDE_CODE_GATEWAY_HINT_HEADERS": "1",
    }
    if endpoint.window:
        environment["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(endpoint.window)
    return environment


def bash_script(environment: dict[str, str]) -> str:
    lines = ["unset ANTHROPIC_API_KEY  # it wins over ANTHROPIC_AUTH_TOKEN and goes to the paid API"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in environment.items()]
    return "\n".join([*lines, "claude"])


# What ends a single-quoted PowerShell string: the ASCII quote and the four typographic ones PowerShell reads as
# quotes too (U+2018 to U+201B); inside the string each is doubled to stand for itself.
POWERSHELL_QUOTES = {ord(quote): quote * 2 for quote in "'\u2018\u2019\u201a\u201b"}


def powershell_literal(value: str) -> str:
    """A single-quoted PowerShell string: nothing in it is expanded; every quote PowerShell knows is doubled."""
    return "'" + value.translate(POWERSHELL_QUOTES) + "'"


def powershell_script(environment: dict[str, str]) -> str:
    lines = ["Remove-Item Env:ANTHROPIC_API_KEY -ErrorAction SilentlyContinue"]
    lines += [f"$env:{name} = {powershell_literal(value)}" for name, value in environment.items()]
    return "\n".join([*lines, "claude"])


def print_environment(endpoint: Endpoint, shell: str = "both") -> None:
    """What `connect` prints once the endpoint answered: what it serves, then Claude Code's environment."""
    window = f"{endpoint.window} tokens" if endpoint.window else "an unknown window"
    print(strip_controls(f"# {endpoint.base_url} serves {endpoint.model!r} with {window}; one token generated."))
    environment = claude_environment(endpoint)
    if shell in ("bash", "both"):
        print(f"\n# bash / zsh\n{bash_script(environment)}")
    if shell in ("powershell", "both"):
        print(f"\n# PowerShell\n{powershell_script(environment)}")
