"""Claude Code's gateway contract as the pinned CLI carries it (the text `claude gateway` serves at `GET /protocol`): a
digest of each of its sections is kept beside this test, so that a new pin whose contract changed fails here until
someone has read what changed and made the bridge follow it.

    python tests/bridge/test_contract_text.py --write   # after reading the changes: the digests of the pinned CLI's text
"""

from __future__ import annotations

import hashlib
import json
import mmap
import re
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: the repository's root on the path, as pytest puts it
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.claude_code import CLAUDE, require_claude_code

DIGESTS = Path(__file__).with_name("claude_code_contract.json")
# How the CLI's bundled JavaScript composes the text it serves: the contract, with a sign-in part put before its
# "## Flow" when no OIDC provider is configured, and the customer-routed inference part appended when that is on.
COMPOSER = re.compile(
    rb"function \w+\(e\)\{let t=e\.oidcConfigured\?(\w+):\1\.replace\(\"## Flow\",`\$\{(\w+)\}## Flow`\);"
    rb"return e\.criEnabled\?t\+(\w+):t\}"
)
ESCAPE = re.compile(r"\\(u\{[0-9a-fA-F]+\}|u[0-9a-fA-F]{4}|.)", re.S)


def contract_parts(binary: Path) -> dict[str, str]:
    """The contract's Markdown parts ("contract", "sign-in without OIDC", "customer-routed inference"), cut out of the
    CLI's executable with their JavaScript escapes undone."""
    with binary.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        composer = COMPOSER.search(data)
        assert composer is not None, f"{binary}: no gateway contract composed as this test knows (read its new form)"
        names = dict(
            zip(("contract", "sign-in without OIDC", "customer-routed inference"), composer.groups(), strict=True)
        )
        return {part: literal(data, name, composer.start()) for part, name in names.items()}


def literal(data: mmap.mmap, name: bytes, before: int) -> str:
    """The template literal assigned to `name` last before `before`, escapes undone."""
    start = max(data.rfind(b"var " + name + b"=`", 0, before), data.rfind(b"," + name + b"=`", 0, before))
    assert start >= 0, f"no text assigned to {name.decode()}"
    start = data.find(b"`", start)
    end = start + 1
    while True:
        end = data.find(b"`", end)
        backslashes = len(data[end - 64 : end]) - len(data[end - 64 : end].rstrip(b"\\"))
        if backslashes % 2 == 0:
            break
        end += 1
    return ESCAPE.sub(unescaped, data[start + 1 : end].decode("utf-8"))


def unescaped(match: re.Match[str]) -> str:
    code = match.group(1)
    if code.startswith("u{"):
        return chr(int(code[2:-1], 16))
    if code.startswith("u") and len(code) == 5:
        return chr(int(code[1:], 16))
    return {"n": "\n", "t": "\t"}.get(code, code)


def section_digests(parts: dict[str, str]) -> dict[str, str]:
    """Each part's `## ` sections (and what precedes the first): `part / heading` → 16 hex digits of its SHA-256."""
    return {f"{part} / {name}": digest for part, text in parts.items() for name, digest in sections_of(text).items()}


def sections_of(text: str) -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    heading = "(before any section)"
    for line in text.splitlines():
        if line.startswith("## "):
            heading = line.removeprefix("## ").strip()
        sections.setdefault(heading, []).append(line)
    return {name: hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16] for name, lines in sections.items()}


def test_the_pinned_clis_contract_is_the_one_the_bridge_follows() -> None:
    require_claude_code()
    kept = json.loads(DIGESTS.read_text())
    found = section_digests(contract_parts(CLAUDE.resolve()))
    changed = sorted(name for name in found.keys() & kept["sections"].keys() if found[name] != kept["sections"][name])
    added, removed = sorted(found.keys() - kept["sections"].keys()), sorted(kept["sections"].keys() - found.keys())
    assert (changed, added, removed) == ([], [], []), (
        f"the pinned Claude Code's gateway contract is not the one read for {kept['read_for']}: changed {changed}, "
        f"new {added}, gone {removed}. Read them (GET /protocol of `claude gateway`, or this test's contract_parts), "
        "make the bridge follow them, then: python tests/bridge/test_contract_text.py --write"
    )


def test_a_changed_clause_is_named_alone() -> None:
    before = section_digests({"contract": "# The contract\n\n## Errors\n401 says retry\n## TLS\nyes\n"})
    after = section_digests({"contract": "# The contract\n\n## Errors\n401 says never retry\n## TLS\nyes\n"})
    assert [name for name in before if before[name] != after[name]] == ["contract / Errors"]


def write_digests() -> None:
    pin = re.search(
        r'^claude-code = "([^"]+)"', (Path(__file__).parents[2] / "docker" / "versions.toml").read_text(), re.M
    )
    sections = section_digests(contract_parts(CLAUDE.resolve()))
    record = {"read_for": f"Claude Code {pin.group(1) if pin else '?'}", "sections": sections}
    DIGESTS.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    print(f"{DIGESTS}: {len(sections)} sections")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    write_digests()
