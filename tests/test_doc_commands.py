"""Every command line the README and docs/ show a user typing is one the program takes: parsed, never run, by the
program's own argparse parser (`runtime/cli.py`'s commands, each module's `configure`; `build.py`'s `parse_args`).
A command the docs name that does not exist, an option it lacks or a required argument left out fails here, one
line per doc line, with its file and line number.

What counts as typed: the lines of a shell block (```bash, ```sh, ```powershell, an unlabelled one), only those
after the prompt (`$ `, `PS> `) in a ```console block or any block with a prompt, and an inline code span that starts
with the command. A line is read as a shell reads it (shlex): a `#` comment dropped, `NAME=value` before the command
skipped, `;`, `&&`, `||`, `|` ending one command, a trailing `\\` joining the next line. Placeholders (`POD_ID`,
`URL`, `<pod-id>`, `hf_…`, `$KEY`) are values the user supplies: any option takes them, whatever its type or choices. A lone `…` or `...` stands
for arguments left out: the others are checked, but not that a required one is there. An inline span that only
names a command (`python -m runtime pod`, `python -m runtime pod up`) is a mention: the command must exist. Skipped,
and said: a pattern, whose command is written `<…>` (`python -m runtime <command> --help`), and a usage synopsis,
with a `[` word (`[--key K]`). A console command followed by the program's own `…: error: …` line is the docs
showing a refusal: the parser must refuse it with that message."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, NoReturn

from runtime.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w-]*)")
SHELLS = {"", "bash", "sh", "shell", "zsh", "console", "shell-session", "powershell", "pwsh", "ps1"}
PROMPT = re.compile(r"^(?:\$|PS>|PS [^>]*>) ")
RUNTIME = (("python", "-m", "runtime"), ("python3", "-m", "runtime"), ("vllm-pod",))
BUILD = (("python", "build.py"), ("python3", "build.py"), ("build.py",), ("./build.py",))
# The program's own refusal, as argparse prints it: `python -m runtime plan: error: argument --sessions: …`.
REFUSAL = re.compile(r"^(?:python3? -m runtime|vllm-pod|python3? build\.py)\b[^:]*: error: (.+)$")
ANGLE = "@PLACEHOLDER@"  # what a `<…>` placeholder becomes before shlex (its spaces and `<` are no shell syntax)
OPERATORS = {";", "&&", "||", "|", "&", "(", ")", ";;", "|&"}
ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
UPPER = re.compile(r"^[A-Z][A-Z_]*(/[A-Z][A-Z_]*)?$")  # POD_ID, URL, K, OWNER/NAME; not H100
ELISION = {"…", "..."}
# An inline span that is a command: the command first, or after its environment (`VL_UTIL=0.93 python -m …`).
START = re.compile(
    r"""^(?:[A-Za-z_]\w*=(?:"[^"]*"|'[^']*'|\S*)\s+)*"""
    + "(?:"
    + "|".join(re.escape(" ".join(prefix)) for prefix in (*RUNTIME, *BUILD))
    + r")(?:\s|$)"
)


def placeholder(word: str) -> bool:
    """A value the user supplies: `POD_ID`, `<pod-id>` (also inside a word), `hf_…`, `$KEY`, `${X#me:}`."""
    return bool(UPPER.match(word)) or ANGLE in word or "…" in word or "..." in word or "$" in word


@dataclass(frozen=True)
class Typed:
    """One command line a user types, as the docs show it."""

    where: str  # file:line
    text: str  # the doc's text (the whole line, or the span)
    inline: bool
    refusal: str | None = None  # the program's error line the docs show after it


def typed(name: str, text: str) -> Iterator[Typed]:
    """The command lines of one Markdown document: its shell blocks' lines and its inline code spans."""
    lines = text.splitlines()
    prose: list[str] = []
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if not fence:
            prose.append(lines[index])
            index += 1
            continue
        start = end = index + 1
        while end < len(lines) and not lines[end].lstrip().startswith(fence.group(1)):
            end += 1
        prose += [""] * (end + 1 - index)  # the block and its fences: no prose, the line numbers kept
        if fence.group(2).lower() in SHELLS:
            yield from block(name, start, lines[start:end], prompted=fence.group(2).lower() == "console")
        index = end + 1
    yield from spans(name, prose)


def block(name: str, start: int, lines: list[str], prompted: bool) -> Iterator[Typed]:
    prompted = prompted or any(PROMPT.match(line) for line in lines)
    index = 0
    while index < len(lines):
        line, number = lines[index], start + index + 1
        index += 1
        if prompted:
            if not (prompt := PROMPT.match(line)):
                continue  # output
            line = line[prompt.end() :]
        while line.rstrip().endswith("\\") and index < len(lines):  # continued on the next line
            line = line.rstrip()[:-1] + " " + lines[index].lstrip().removeprefix("> ")
            index += 1
        refusal = None
        if prompted:
            output = lines[index:]
            output = output[: next((k for k, out in enumerate(output) if PROMPT.match(out)), len(output))]
            refusal = next((match.group(1) for out in output if (match := REFUSAL.match(out))), None)
        yield Typed(f"{name}:{number}", line.strip(), inline=False, refusal=refusal)


def spans(name: str, prose: list[str]) -> Iterator[Typed]:
    """Inline code spans, paragraph by paragraph: a span may continue on the next line of its paragraph."""
    first = 0
    for number, line in enumerate([*prose, ""], 1):
        if line.strip():
            first = first or number
            continue
        paragraph = "\n".join(prose[first - 1 : number - 1]) if first else ""
        for match in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", paragraph, re.DOTALL):
            where = f"{name}:{first + paragraph.count(chr(10), 0, match.start())}"
            yield Typed(where, " ".join(match.group(2).split()), inline=True)
        first = 0


def without_comment(line: str) -> str:
    """The line up to its first `#` that starts a word outside quotes (shlex would cut `${X#me:}` too)."""
    quote, escaped = "", False
    for position, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (position == 0 or line[position - 1].isspace()):
            return line[:position]
    return line


def commands(line: str) -> Iterator[tuple[str, list[str]]]:
    """(program, its arguments) for each of ours among a line's simple commands; program is 'runtime' or 'build'."""
    lexer = shlex.shlex(re.sub(r"<[^<>`]*>", ANGLE, without_comment(line)), posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, ""
    words: list[str] = []
    for word in [*lexer, ";"]:
        if word not in OPERATORS:
            words.append(word)
            continue
        while words and ASSIGNMENT.match(words[0]):
            words.pop(0)  # NAME=value before the command: its environment
        for program, prefixes in (("runtime", RUNTIME), ("build", BUILD)):
            for prefix in prefixes:
                if tuple(words[: len(prefix)]) == prefix:
                    yield program, words[len(prefix) :]
        words = []


class Refused(Exception):
    pass


class Exited(Exception):
    pass


class DocParser(argparse.ArgumentParser):
    """The program's parser, but a refusal raises (its message), a placeholder passes any type and choice, and
    `--help` prints nothing. While `lenient` (a line with `…`), nothing is required."""

    lenient = False

    def error(self, message: str) -> NoReturn:
        raise Refused(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise Exited(status)

    def print_help(self, file: Any = None) -> None:
        pass

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if DocParser.lenient:
            for action in self._actions:
                action.required = False
            for group in self._mutually_exclusive_groups:
                group.required = False
        return super().parse_known_args(args, namespace)

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError:
            if placeholder(arg_string):
                return arg_string
            raise

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if isinstance(value, str) and placeholder(value) and not isinstance(action, argparse._SubParsersAction):
            return
        super()._check_value(action, value)


@cache
def build_module() -> ModuleType:
    """build.py, imported under another name (a `build` package may be installed) and never run."""
    spec = importlib.util.spec_from_file_location("build_cli", ROOT / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Its parser is built inside parse_args, from its own `argparse`: ours refuses by raising.
    module.__dict__["argparse"] = SimpleNamespace(**{**vars(argparse), "ArgumentParser": DocParser})
    return module


def runtime_parser(name: str) -> tuple[argparse.ArgumentParser, bool]:
    """A command's parser, as runtime/cli.py builds it, and whether it passes on what follows `--`."""
    module = importlib.import_module(COMMANDS[name][0])
    parser = DocParser(prog=f"python -m runtime {name}")
    module.configure(parser)
    return parser, bool(getattr(module, "PASSES_ON", False))


def only_names(parser: argparse.ArgumentParser, words: Sequence[str]) -> bool:
    """Whether the words are only sub-command names the parser knows (`up` of `pod`): a mention, not a command."""
    for word in words:
        found = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
        if not found or word not in found[0].choices:
            return False
        parser = found[0].choices[word]
    return True


def refusal(program: str, words: list[str], inline: bool) -> str | None:
    """Why the program's parser refuses these arguments; None when it takes them."""
    parse: Callable[[], object]
    if program == "runtime":
        if not words or words[0] in ("-h", "--help", "help"):
            return None
        if words[0] not in COMMANDS:
            return f"unknown command {words[0]!r}"
        parser, passes_on = runtime_parser(words[0])
        rest = words[1:]
        if passes_on and "--" in rest:
            rest = rest[: rest.index("--")]  # Claude Code's arguments
        if inline and only_names(parser, rest):
            return None
        parse = lambda: parser.parse_args(rest)  # noqa: E731
    else:
        module = build_module()
        if inline and not words:
            return None
        parse = lambda: module.parse_args(words, module.load_targets())  # noqa: E731
    DocParser.lenient = bool(ELISION & set(words))
    try:
        parse()
    except Refused as error:
        message = str(error)
        extra = message.removeprefix("unrecognized arguments: ")
        return None if extra != message and set(extra.split()) <= ELISION else message  # `…` alone: the rest
    except Exited:
        pass  # --help
    finally:
        DocParser.lenient = False
    return None


def pattern(program: str, words: list[str]) -> str | None:
    """Why a line is a pattern rather than a command: the small explicit rule, said for each line skipped."""
    if any(word.startswith("[") for word in words):
        return "a usage synopsis ([…])"
    names = words[:2] if program == "runtime" and words and words[0] in COMMANDS and has_verbs(words[0]) else words[:1]
    if program == "runtime" and any(ANGLE in word for word in names):
        return "a pattern (a command written <…>)"
    return None


def has_verbs(name: str) -> bool:
    parser = runtime_parser(name)[0]
    return any(isinstance(action, argparse._SubParsersAction) for action in parser._actions)


def judge(document: str, text: str) -> tuple[list[str], list[str], int]:
    """(the offending lines, the skipped ones, how many commands were checked), one line each."""
    offending, skipped, checked = [], [], 0
    for line in typed(document, text):
        if line.inline and not START.match(line.text):
            continue  # a span that does not start with the command (or its environment)
        try:
            found_commands = list(commands(line.text))
        except ValueError as error:  # shlex: an unclosed quote
            offending.append(f"{line.where}: `{line.text}`: a shell cannot read it: {error}")
            continue
        shown = without_comment(line.text).strip()  # the command, not its comment
        for program, words in found_commands:
            if why := pattern(program, words):
                skipped.append(f"{line.where}: skipped, {why}: {shown}")
                continue
            checked += 1
            found = refusal(program, words, line.inline)
            if line.refusal is None and found is not None:
                offending.append(f"{line.where}: `{shown}`: {found}")
            elif line.refusal is not None and found != line.refusal:
                said = f"refused: {found}" if found else "taken"
                offending.append(f"{line.where}: `{shown}`: the docs show it refused ({line.refusal}); {said}")
    return offending, skipped, checked


def test_every_command_line_in_the_docs_is_one_the_program_takes() -> None:
    offending, skipped, checked = [], [], 0
    for document in DOCUMENTS:
        found = judge(str(document.relative_to(ROOT)), document.read_text())
        offending += found[0]
        skipped += found[1]
        checked += found[2]
    print("\n".join(skipped))
    assert checked > 60, f"only {checked} command lines found: the finder no longer finds them"
    assert not offending, "\n".join([*offending, "", *skipped])


def test_the_checker_refuses_what_the_program_would() -> None:
    """The finder and the parsers on made-up lines: what must fail fails, what a shell reads otherwise passes."""
    text = """\
```bash
python -m runtime lanch URL                                  # a typo of a command
vllm-pod pod up --template T --volumes models                # an option pod up lacks
python -m runtime bridge --port 8080                         # --upstream left out
HF_TOKEN=hf_… python build.py --arch sm89 --push --runpod    # fine: the environment, then the command
python -m runtime status https://<pod-id>-8080.proxy.runpod.net --key <one of VL_API_KEYS>  # fine: placeholders
python -m runtime launch URL -- -p "hello" --bogus           # fine: after -- is Claude Code's
echo "python -m runtime nothing" | python build.py --arch sm89 --pusj
python -m runtime <command> --help
python -m runtime plan --sessions 0 \\
  --gpu L40S
```

```console
$ python -m runtime plan --sessions 0
python -m runtime plan: error: argument --sessions: a wrong message
```

Prose: `python -m runtime pod` (a mention), `python -m runtime pod upp`, `vllm-pod pod up …`, `python build.py`,
`VL_UTIL=0.93 python -m runtime plan
--modle flashnext`, `python -m runtime status [--key K]`.
"""
    offending, skipped, checked = judge("made-up.md", text)
    assert [line.split(": `")[0] for line in offending] == [
        "made-up.md:2",
        "made-up.md:3",
        "made-up.md:4",
        "made-up.md:8",
        "made-up.md:10",
        "made-up.md:15",
        "made-up.md:19",
        "made-up.md:20",
    ], "\n".join(offending)
    assert offending[0].endswith("unknown command 'lanch'")
    assert offending[1].endswith("unrecognized arguments: --volumes models")
    assert offending[2].endswith("the following arguments are required: --upstream")
    assert offending[3].endswith("unrecognized arguments: --pusj")
    assert "--sessions" in offending[4]
    assert (
        "the docs show it refused (argument --sessions: a wrong message); refused: argument --sessions" in offending[5]
    )
    assert "invalid choice: 'upp'" in offending[6]
    assert offending[7].endswith("unrecognized arguments: --modle flashnext")
    assert skipped == [
        "made-up.md:9: skipped, a pattern (a command written <…>): python -m runtime <command> --help",
        "made-up.md:21: skipped, a usage synopsis ([…]): python -m runtime status [--key K]",
    ]
    assert checked == 14
