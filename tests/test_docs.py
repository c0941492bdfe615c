"""The documentation holds together: every relative link of the README and docs/ reaches a file and, with an
anchor, a heading of it; docs/development.md names every module of runtime/ and space/; the commands
reference names every command; and every `VL_MODEL=`/`VL_SWAP=` example is one the settings accept (a reader
copies them: the first VL_SWAP example once named a recipe the project did not ship, and a pod started with it
stopped at its first line)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from runtime.cli import COMMANDS
from runtime.settings import SettingsError, load_settings

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks: a `#` in a shell example is no heading."""
    fenced = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield number, line


def anchors(path: Path) -> set[str]:
    """The anchors a Markdown renderer gives the headings of `path` (GitHub's rule: lower case, punctuation
    dropped, spaces to hyphens, a repeated one numbered)."""
    counts: dict[str, int] = {}
    found = set()
    for _, line in prose(path):
        if match := re.match(r"#{1,6} (.+)", line):
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            found.add(f"{slug}-{counts[slug]}" if slug in counts else slug)
            counts[slug] = counts.get(slug, 0) + 1
    return found


def test_every_relative_link_reaches_a_file_and_its_heading() -> None:
    broken, checked = [], 0
    for document in DOCUMENTS:
        for number, line in prose(document):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # https:, mailto:: not ours to check offline
                checked += 1
                file, _, anchor = target.partition("#")
                path = (document.parent / file).resolve() if file else document
                where = f"{document.relative_to(ROOT)}:{number}: {target}"
                if not path.is_file():
                    broken.append(f"{where} (no such file)")
                elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                    broken.append(f"{where} (no such heading in {path.relative_to(ROOT)})")
    assert checked > 40, "the links are no longer found"
    assert broken == []


def test_every_document_is_reached_from_the_readme() -> None:
    """A page nobody links to is a page nobody reads: each is linked from the README or from a page it links."""
    reached, frontier = set(), [ROOT / "README.md"]
    while frontier:
        document = frontier.pop()
        reached.add(document)
        for _, line in prose(document):
            for target in LINK.findall(line):
                path = (document.parent / target.partition("#")[0]).resolve()
                if path.suffix == ".md" and path.is_file() and path not in reached:
                    frontier.append(path)
    assert sorted(map(str, set(DOCUMENTS) - reached)) == []


def modules() -> list[Path]:
    files = [*ROOT.glob("runtime/**/*.py"), *ROOT.glob("space/**/*.py")]
    return sorted(path for path in files if path.name != "__init__.py" or path.parent.name == "recipes")


def test_the_development_guide_names_every_module() -> None:
    """Where things are: each module by its path, or by its name on a line that names its folder."""
    lines = (ROOT / "docs" / "development.md").read_text().splitlines()
    unnamed = []
    for path in modules():
        relative = str(path.relative_to(ROOT))
        folder = f"{path.parent.relative_to(ROOT)}/"
        if not any(relative in line or (folder in line and f"`{path.name}`" in line) for line in lines):
            unnamed.append(relative)
    assert not unnamed, "docs/development.md does not say where these are:\n  " + "\n  ".join(unnamed)


def test_the_commands_reference_names_every_command() -> None:
    text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert [name for name in COMMANDS if f"| `{name}` |" not in text] == []


EXAMPLE = re.compile(r"\b(VL_MODEL|VL_SWAP)=(\"[^\"]*\"|'[^']*'|[\w.:,-]+)")
KEYS = "me:sk-0123456789abcdef0123456789abcdef"  # VL_SWAP needs keys (the guide's example sets them first)


def test_every_model_example_is_accepted_by_the_settings() -> None:
    examples = [example for document in DOCUMENTS for example in EXAMPLE.findall(document.read_text())]
    assert {name for name, _ in examples} == {"VL_MODEL", "VL_SWAP"}, "the pattern no longer finds the examples"
    refused = []
    for name, value in examples:
        try:
            load_settings({name: value.strip("\"'"), "VL_API_KEYS": KEYS})
        except SettingsError as error:
            refused.append(str(error))
    assert refused == []
