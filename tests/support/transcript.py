"""The README's journey as a script: its console block's commands, run as a user's shell runs them, and the lines
each prints compared with the README's, `…` standing for what varies.

A step is a `$ ` line and the lines under it. `export NAME=VALUE` sets a variable for the steps after it;
`NAME=VALUE command` for that command alone; a `# comment` is the shell's. A value the README leaves to the user
(`hf_…`, `sk-…`) is the test's own, by the variable's name. Example names the README uses (its pod
id, its Hub user) are replaced by the real ones before comparing. Lines match when they are equal once runs of
spaces are one space; within a line `…` is any text, and a line that is `…` alone any lines, or none.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ASSIGNMENT = re.compile(r"^([A-Z_][A-Z0-9_]*)=(.*)$")
LEFT_TO_THE_USER = re.compile(r"…")  # a value the README does not give: hf_…, sk-…


@dataclass(frozen=True)
class Step:
    command: str  # as the README writes it after `$ `, its comment included
    printed: tuple[str, ...]  # the lines under it, up to the next step (trailing blank lines left out)

    @property
    def words(self) -> list[str]:
        return shlex.split(self.command, comments=True)


def journey(readme: str) -> list[Step]:
    """The steps of the README's first console block."""
    match = re.search(r"^```console\n(.*?)^```", readme, re.S | re.M)
    assert match, "the README has no ```console block"
    steps: list[Step] = []
    command: str | None = None
    printed: list[str] = []
    for line in match[1].splitlines():
        if line.startswith("$ "):
            if command is not None:
                steps.append(Step(command, tuple(trimmed(printed))))
            command, printed = line[2:], []
        else:
            printed.append(line)
    if command is not None:
        steps.append(Step(command, tuple(trimmed(printed))))
    return steps


def trimmed(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def pattern(expected: list[str]) -> re.Pattern[str]:
    """A regular expression for the whole output: `…` alone on a line is any lines, in a line any text."""
    parts = []
    for line in expected:
        if line.strip() == "…":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            text = " ".join(line.split())
            parts.append("[^\n]*?".join(re.escape(piece) for piece in text.split("…")) + r"\n")
    return re.compile("".join(parts), re.S)


def normalised(output: str) -> str:
    """Each line with its runs of spaces as one, its ends trimmed, and a newline after it."""
    return "".join(" ".join(line.split()) + "\n" for line in output.splitlines())


def differs(expected: list[str], output: str) -> str | None:
    """None when `output` is what the README shows; else the first README line it does not print, and both whole."""
    printed = normalised(output.rstrip())  # blank lines at the end are no line of the README's
    if pattern(expected).fullmatch(printed):
        return None
    held = next(n for n in range(len(expected), -1, -1) if pattern(expected[:n]).match(printed))
    first = expected[held] if held < len(expected) else "(the README's lines end here)"
    shown = "\n".join(expected)
    return f"first README line not printed: {first}\n\nthe README shows:\n{shown}\n\nthe command printed:\n{output}"


@dataclass
class Shell:
    """The user's shell along the journey: its variables, and the values it gives what the README leaves open."""

    cwd: Path
    environ: dict[str, str]
    secrets: Mapping[str, str]  # by variable name: what the user would type for `hf_…`, `sk-…`
    examples: dict[str, str]  # the README's example names → the real ones, longest first when applied

    def real(self, text: str) -> str:
        for example in sorted(self.examples, key=len, reverse=True):
            text = text.replace(example, self.examples[example])
        return text

    def value(self, name: str, value: str) -> str:
        return self.secrets[name] if LEFT_TO_THE_USER.search(value) else self.real(value)

    def run(self, step: Step, timeout_s: float) -> subprocess.CompletedProcess[str] | None:
        """Runs the step as the shell would: an `export` changes the shell (None); a command runs, its standard
        output and error merged as a terminal shows them, with no terminal to answer a question."""
        words = step.words
        if words[0] == "export":
            assert len(words) == 2 and ASSIGNMENT.fullmatch(words[1]), f"not one shell assignment: {step.command}"
            name, value = ASSIGNMENT.fullmatch(words[1]).groups()
            self.environ[name] = self.value(name, value)
            return None
        environ = dict(self.environ)
        while match := ASSIGNMENT.fullmatch(words[0]):
            environ[match[1]] = self.value(match[1], match[2])
            words = words[1:]
        argv = [sys.executable if words[0] == "python" else words[0], *(self.real(word) for word in words[1:])]
        return subprocess.run(argv, cwd=self.cwd, env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout_s)  # fmt: skip

    def check(self, step: Step, done: subprocess.CompletedProcess[str]) -> str:
        """Fails unless the step's command ended with 0 and printed what the README shows; returns its output."""
        assert done.returncode == 0, f"$ {step.command}\nexited with {done.returncode}:\n{done.stdout}"
        difference = differs([self.real(line) for line in step.printed], done.stdout)
        assert difference is None, f"$ {step.command}\n{difference}"
        return done.stdout
