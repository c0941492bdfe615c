"""The pod's last benchmark (`runtime bench`), kept beside the usage ledger (on the volume, when the pod has one): the
bench sends it with an admin key, the bridge checks and keeps it, the console and `runtime status` show it.

What is kept is the bench's own report, checked field by field (an admin's, but still input of the public port: a
bounded size, numbers where numbers go), with the time it arrived.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.state.statefile import Watched, write_json

FILE = "bench.json"
MAX_BYTES = 64 * 2**10  # a report is ~2 KiB
Rate = Annotated[float, Field(ge=0, le=1e9)] | None
Count = Annotated[int, Field(ge=0, le=10**9)]
Name = Annotated[str, Field(max_length=128)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SoloRow(Strict):
    context: Count
    tokens: Count
    decode_tok_s: Rate
    ttft_s: Rate


class SessionsRow(Strict):
    sessions: Count
    tokens: Count
    aggregate_tok_s: Rate
    slowest_session_tok_s: Rate


class PrefillRow(Strict):
    prompt_tokens: Count
    cached_tokens: Count
    ttft_s: Rate
    prefill_tok_s: Rate


class Reference(Strict):
    card: Name
    solo_tok_s: Rate
    aggregate_at_8_tok_s: Rate
    solo_ratio: Rate
    aggregate_at_8_ratio: Rate


class BenchReport(Strict):
    model: Name
    gpu: Name | None
    solo: Annotated[list[SoloRow], Field(max_length=16)]
    aggregate: Annotated[list[SessionsRow], Field(max_length=16)]
    prefill: dict[Literal["cold", "warm"], PrefillRow]
    reference: Reference | None


class BenchRefused(ValueError):
    """A report the bridge does not keep: one line saying why."""


def checked_report(data: Any) -> dict[str, Any]:
    """The report as the bench sent it, once every field is what it should be; BenchRefused otherwise."""
    try:
        return BenchReport.model_validate(data).model_dump()
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the report"
        raise BenchRefused(f"not a bench report: {where}: {first['msg']}") from None


def keep_bench(folder: Path, report: dict[str, Any]) -> None:
    write_json(folder / FILE, {**report, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def kept_bench(folder: Path) -> Watched[dict[str, Any]]:
    """The last report kept, read again only when a new one replaced it (the console asks every 2 s); None before the
    first, or for a file that is not a report (the volume is the user's to edit)."""
    return Watched(folder / FILE, as_report)


def as_report(kept: Any) -> dict[str, Any] | None:
    if not isinstance(kept, dict):
        return None
    try:
        return {**checked_report({k: v for k, v in kept.items() if k != "at"}), "at": str(kept.get("at", ""))}
    except BenchRefused:
        return None


def summary(report: dict[str, Any]) -> str:
    """The last bench in one line (`runtime status`'s Bench row; the console says the same)."""
    parts = []
    if report["solo"]:
        first = report["solo"][0]
        parts.append(f"solo {shown(first['decode_tok_s'])} tok/s at {first['context']:,} tokens")
    if report["aggregate"]:
        most = report["aggregate"][-1]
        parts.append(f"{most['sessions']} sessions {shown(most['aggregate_tok_s'])} tok/s")
    if cold := report["prefill"].get("cold"):
        parts.append(f"prefill {shown(cold['prefill_tok_s'])} tok/s cold")
    if reference := report["reference"]:
        ratio = "—" if reference["solo_ratio"] is None else f"{reference['solo_ratio']:.2f}"
        parts.append(f"{ratio} of the notes' solo on an {reference['card']}")
    return f"{report.get('at') or 'undated'}: " + ", ".join(parts)


def shown(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}".removesuffix(".0")
