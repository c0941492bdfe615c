"""The Hub settings file (`VL_NAME=value` lines): parsed, then judged against the pod it would change.

One judge for every reader: the pod at start and on each live change (runtime.pod.hubside), and
`python -m runtime settings --check FILE`, so that all three refuse the same files in the same words.
Besides bad values, a file may not set a pod setting (ports, paths, repos, intervals: the pod's
environment only), put a secret in a repo that is not private, or leave a keyed pod open.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from runtime.settings import (
    BY_ENV,
    Scope,
    Settings,
    SettingsError,
    is_secret,
    load_settings,
    not_a_setting,
    parse_value,
    quoted,
)

# A settings file holds a few hundred bytes; a larger one is refused unread (a 50 MB value once took 7.8 s and 281 MB).
MAX_FILE_BYTES = 64 * 1024
MAX_REASONS = 10  # a refusal names this many problems at most, then counts the others
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class SettingsFile:
    """One version of the settings file as it was read: its text ('' once deleted), where it lives, its
    size, and whether its repo is private (None: not known, so the public-repo rule cannot apply)."""

    text: str
    where: str
    private: bool | None = None
    size: int | None = None  # when known before reading: a file over MAX_FILE_BYTES is not downloaded

    @property
    def bytes(self) -> int:
        return len(self.text.encode()) if self.size is None else self.size


class FileRefused(ValueError):
    """The file cannot be applied; `str()` is the one line that says where it is and every reason."""

    def __init__(self, where: str, reasons: list[str]) -> None:
        self.where, self.reasons = where, reasons
        shown = reasons[:MAX_REASONS] + [f"and {len(reasons) - MAX_REASONS} more"] * (len(reasons) > MAX_REASONS)
        super().__init__(f"refused {where}: {'; '.join(shown)}")


def parse_settings_file(text: str, source: str = "pod.env") -> dict[str, str]:
    """`VL_NAME=value` lines; blank lines and `#` comments (whole-line, or after a space) are ignored.

    A value may be quoted ('…' or "…", kept verbatim); `export ` before a name is accepted, as in a shell.
    Raises FileRefused naming the line.
    """
    values: dict[str, str] = {}
    lines_of: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"line {number}"
        name, equals, raw = stripped.removeprefix("export ").partition("=")
        name = name.strip()
        if not equals or not _NAME.fullmatch(name):
            raise FileRefused(source, [f"{where}: expected VL_NAME=value, got {shown_line(stripped)}"])
        if name in values:
            raise FileRefused(source, [f"{where}: {clipped(name)} is already set on line {lines_of[name]}"])
        values[name], lines_of[name] = unquote(raw.strip(), source, where), number
    return values


def shown_line(line: str) -> str:
    """A malformed line as a refusal quotes it: cut short, and only its first word when that names a secret."""
    first = re.split(r"[\s=]", line, maxsplit=1)[0]
    return quoted(f"{first} ..." if is_secret(first) and first != line else line)


def clipped(name: str) -> str:
    return name if len(name) <= 64 else f"{name[:64]}..."


def unquote(raw: str, source: str, where: str) -> str:
    if raw[:1] in ("'", '"'):
        if len(raw) < 2 or raw[-1] != raw[0]:
            raise FileRefused(source, [f"{where}: the quote opened by {raw[0]} is not closed at the end of the line"])
        return raw[1:-1]
    return re.split(r"\s#", raw, maxsplit=1)[0].rstrip()


def settings_with_file(
    current: Settings,
    environ: Mapping[str, str],
    file: SettingsFile,
    learn: Callable[[Mapping[str, str]], None] = lambda values: None,
) -> Settings:
    """The settings the pod would run on with `file`: defaults < the file < `environ` (the pod's own).

    `current` is what runs now (at start: the environment's settings); `learn` sees the file's values
    before any judgement (the Hub log's redactor learns its secrets). Raises FileRefused.
    """
    if file.bytes > MAX_FILE_BYTES:
        raise FileRefused(
            file.where, [f"{file.bytes:,} bytes, at most {MAX_FILE_BYTES:,} (a file of VL_NAME=value lines)"]
        )
    values = parse_settings_file(file.text, file.where)
    learn(values)
    reasons = problems(values, file.private)
    if reasons:
        raise FileRefused(file.where, reasons)
    try:
        new = load_settings(environ, values)
    except SettingsError as error:  # the file's values together (a dollar budget without a price): refused alike
        raise FileRefused(file.where, [str(error)]) from None
    if current.api_keys and not new.api_keys:
        raise FileRefused(
            file.where,
            [
                "the pod has keys, and this file would leave VL_API_KEYS empty, the pod open to anyone who reaches "
                "it (a file may change the keys, never remove them all)"
            ],
        )
    return new


def problems(values: Mapping[str, str], private: bool | None) -> list[str]:
    """Every reason to refuse these values, in the file's order; none when they may be applied."""
    reasons, pod_scoped = [], []
    for name, raw in values.items():
        variable = BY_ENV.get(name)
        if variable is None:
            reasons.append(not_a_setting(clipped(name)))
        elif variable.scope is Scope.POD:
            pod_scoped.append(name)
        elif variable.secret and private is False:
            reasons.append(
                f"{name} is a secret and this repo is public: set it in the pod's environment, "
                "or keep the file in a private repo"
            )
        else:
            try:
                parse_value(variable, raw)
            except SettingsError as error:
                reasons.append(str(error))
    if pod_scoped:
        what = "is a pod setting: set it" if len(pod_scoped) == 1 else "are pod settings: set them"
        reasons.insert(0, f"{', '.join(pod_scoped)} {what} in the pod's environment (the RunPod template)")
    return reasons
