"""`python -m runtime status [URL] [--key K] [--watch]`: the pod's console in a terminal, for SSH sessions.

Reads the bridge's `GET /v1/pod/status` and prints it as tables; `--watch` redraws it in place every
2 s until Ctrl-C. The pod and its key follow the client commands' one rule (runtime.client.identity).
`render` is a pure function of the status object.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from runtime.checks.bounded import DeadlineSettingError, Limits, OverLimit, limits, request_sync
from runtime.client.identity import pod_key, pod_url
from runtime.headers import KEY_DEFAULT, api_headers
from runtime.logsafe import strip_controls, terminal_line
from runtime.runpod.proxy import proxy_url
from runtime.state.benchreport import summary
from runtime.state.selfcheck import checked

STATUS_PATH = "/v1/pod/status"
WATCH_EVERY_S = 2.0
STOP_CHECK_S = 0.1  # how soon a Ctrl-C ends the watch's wait
TIMEOUT_S = 10.0  # the whole request, its answer read to the end (VLLM_POD_DEADLINE_S replaces it)
REDRAW = "\x1b[H\x1b[2J"  # cursor home, clear the screen: the table is redrawn where it was
SPARK = "▁▂▃▄▅▆▇█"
SHOWN_VERSIONS = ("vllm", "torch")  # of the image's pinned versions, the two people ask about


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "url",
        nargs="?",
        help=f"the bridge, e.g. {proxy_url('<pod>', environ={})} (default: the pod `pod up` last brought up)",
    )
    parser.add_argument("--key", help=f"an API key of VL_API_KEYS (default: {KEY_DEFAULT})")
    parser.add_argument("--watch", action="store_true", help=f"redraw every {WATCH_EVERY_S:g} s until Ctrl-C")


def run(args: argparse.Namespace) -> int:
    url = pod_url(args.url)
    if url is None:
        print("status: no URL, and no pod brought up by `pod up` yet: give the pod's URL", file=sys.stderr)
        return 2
    headers = api_headers(pod_key(args.key, url))
    try:
        bounds = limits(TIMEOUT_S)
    except DeadlineSettingError as error:
        print(f"status: {error}", file=sys.stderr)
        return 2
    asked = Asked(url.rstrip("/"), headers, bounds)
    # The environment's proxy and CA settings apply, as for `runtime connect`: the pod is usually remote.
    if not args.watch:
        shown, problem = shown_status(asked)
        if shown is None:
            print(problem, file=sys.stderr)
            return 1
        print(shown)
        return 0
    return watch(asked)


@dataclass(frozen=True)
class Asked:
    """The pod's status page as a command asks it: where, with which headers, within which limits."""

    base_url: str
    headers: Mapping[str, str]
    bounds: Limits


def watch(asked: Asked) -> int:
    """Redraw every WATCH_EVERY_S until Ctrl-C, which ends the loop between two fetches: a KeyboardInterrupt raised
    inside httpx can leave its connection pool's lock held, and closing the client then waits for ever (a test
    hung so under load). A second Ctrl-C leaves at once."""
    interrupted: list[int] = []

    def on_interrupt(signum: int, frame: object) -> None:
        if interrupted:
            os._exit(130)  # the shell's code for Ctrl-C: the user asked twice
        interrupted.append(signum)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        while not interrupted:
            shown, problem = shown_status(asked)
            shown = shown if shown is not None else f"{problem}\n(retrying every {WATCH_EVERY_S:g} s)"
            sys.stdout.write(REDRAW + shown + "\n")
            sys.stdout.flush()
            until = time.monotonic() + WATCH_EVERY_S
            while not interrupted and time.monotonic() < until:
                time.sleep(STOP_CHECK_S)
    finally:
        signal.signal(signal.SIGINT, previous)
    return 0


def fetch(asked: Asked) -> tuple[dict[str, Any] | None, str]:
    """The status object, or None and one line saying why not (never the key): the whole answer within the deadline
    and the size cap (runtime.checks.bounded), else that line says which it overran."""
    where = f"{asked.base_url}{STATUS_PATH}"
    try:
        response = request_sync(asked.base_url, asked.headers, "GET", STATUS_PATH, asked.bounds)
    except OverLimit as error:
        return None, strip_controls(str(error))
    except httpx.HTTPError as error:
        return None, strip_controls(f"cannot reach {where}: {type(error).__name__}")
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        return None, one_line(f"{where} answered {response.status_code}: {message}")
    try:
        state = response.json()
    except ValueError:
        return None, one_line(f"{where} answered 200 with no JSON: {response.text[:200]}")
    if not isinstance(state, dict):
        return None, one_line(f"{where} answered 200 with no status object: {response.text[:200]}")
    return state, ""


def shown_status(asked: Asked) -> tuple[str | None, str]:
    """The status as the terminal shows it, or None and one line saying why not (a status this client cannot read
    among them: a traceback is no answer)."""
    state, problem = fetch(asked)
    if state is None:
        return None, problem
    try:
        return render(state), ""
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        return None, one_line(f"status: {asked.base_url}{STATUS_PATH} is not a status this client reads ({error!r})")


def one_line(text: str) -> str:
    """A server's words as one line of the terminal: no control, no line break."""
    return terminal_line(str(text))


def render(state: Mapping[str, Any]) -> str:
    """The status as text: sections for the engine, traffic, keys, GPUs and cost. Every value the bridge
    sent is stripped of terminal controls (the boot log is a process's output)."""
    sections = [
        overview(state),
        traffic(state["traffic"]),
        capacity(state.get("capacity")),
        keys(state["keys"], state.get("you")),
        sessions(state.get("sessions", [])),
        gpus(state),
        cost(state["cost"]),
    ]
    if len(state.get("engines", [])) > 1:
        sections.insert(1, engines(state["engines"]))
    boot_log = state["engine"]["boot_log"]
    if boot_log:
        sections.insert(1, "\n".join(["Engine log (last lines)", *(f"  {line}" for line in boot_log)]))
    return strip_controls("\n\n".join(sections))


def overview(state: Mapping[str, Any]) -> str:
    model = state["model"]
    window = f" (window {model['context_window']:,} tokens)" if model and model["context_window"] else ""
    rows = [
        ("Model", f"{model['name']}{window}" if model else "not known yet"),
        ("Engine", state["engine"]["state"]),
        ("Up", duration(state["uptime_s"])),
        ("Image", image(state["image"])),
    ]
    if swap := state.get("swap"):  # VL_SWAP
        rows.insert(2, ("Swap", swapping(swap)))
    if verdict := state.get("selfcheck"):  # VL_SELFCHECK
        rows.insert(2, ("Checked", self_checked(verdict)))
    if bench := state.get("bench"):  # runtime bench's last report
        rows.append(("Bench", summary(bench)))
    if refused := state.get("hub_log_refused"):  # a token that cannot write: `runtime logs` shows nothing
        rows.append(("Hub log", refused))
    for node, standing in (state.get("nodes") or {}).items():  # a cluster's workers (rank 0's node link)
        rows.insert(2, (node.capitalize(), standing))
    for engine, why in (state.get("stopped") or {}).items():  # a sick host, a setting vLLM cannot take
        rows.insert(1, ("Stopped", f"{engine} {why}"))
    return "\n".join(f"{name:<8}{value}" for name, value in rows)


def self_checked(verdict: Mapping[str, Any]) -> str:
    """The pod's self-check in one line: its verdict, and how many of its checks passed."""
    ran = [check for check in verdict["checks"] if check.get("status") != "skipped"]
    passed = sum(1 for check in ran if check.get("status") == "passed")
    return f"{checked(verdict)} ({passed} of {len(ran)} checks passed)"


def swapping(swap: Mapping[str, Any]) -> str:
    """The model swap in one line: under way, or what is loaded and what a request may load."""
    if swap.get("target"):
        line = f"{swap['loaded']} -> {swap['target']}: {swap['phase']} for {duration(swap['phase_for_s'])}"
    else:
        others = sorted(name for name, recipe in swap["models"].items() if recipe != swap["loaded"])
        line = f"{swap['loaded']} loaded; on demand: {', '.join(others) or 'none'}"
    if last := swap.get("last"):
        line += f" (last: {last['from']} -> {last['to']} in {duration(last['seconds'])})"
    return line


def engines(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line per engine of a pod with several (VL_REPLICAS)."""
    lines = ["Engines"]
    for row in rows:
        detail = ""
        if row["state"] == "healthy":
            detail = (
                f"  running {optional(row['running'])}, waiting {optional(row['waiting'])}, "
                f"KV {percent(row['kv_use'])}, prefix-cache hits {percent(row['prefix_hit_rate'])}"
            )
        lines.append(f"  engine {row['replica']}  {row['state']}{detail}")
    return "\n".join(lines)


def percent(share: float | None) -> str:
    return "?" if share is None else f"{share:.0%}"


def image(facts: Mapping[str, Any] | None) -> str:
    if facts is None:
        return "not prebaked (installed at start)"
    shown = [f"{name}={value}" for name, value in facts.items() if value is not None and not isinstance(value, Mapping)]
    versions = facts.get("versions")
    if isinstance(versions, Mapping):
        shown += [f"{name}={versions[name]}" for name in SHOWN_VERSIONS if versions.get(name)]
    return "  ".join(shown) or "no build facts"


def traffic(data: Mapping[str, Any]) -> str:
    minutes = data["window_s"] / 60
    hit = data["prefix_cache_hit_rate"]
    cache = f"{hit:.1%} of {data['prompt_tokens']:,} prompt tokens" if hit is not None else "no prompt yet"
    rows = [
        ("requests/min", f"{data['requests_per_min']:.1f}", "open streams", str(data["open_streams"])),
        ("output tok/s", f"{data['output_tokens_per_s']:.1f}", "vLLM running", optional(data["running"])),
        ("TTFT p50", seconds(data["ttft_p50_s"]), "vLLM waiting", optional(data["waiting"])),
        ("TTFT p95", seconds(data["ttft_p95_s"]), "prefix cache", cache),
    ]
    lines = [f"Traffic (last {minutes:g} min)"] + [f"  {a:<14}{b:>10}    {c:<14}{d}" for a, b, c, d in rows]
    return "\n".join(lines)


def capacity(panel: Mapping[str, Any] | None) -> str:
    """Why it is slow: the verdict, then what it rests on (vLLM's own metrics)."""
    if panel is None:
        return "Capacity\n  no engine metrics yet"
    over = f"last {panel['over_s']:.0f} s" if panel["over_s"] is not None else "one sample yet"
    rows = [
        ("KV cache", percent(panel["kv_use"]), "prefill tok/s", optional(panel["prefill_tokens_per_s"], "{:,.0f}")),
        ("running", str(panel["running"]), "decode tok/s", optional(panel["decode_tokens_per_s"], "{:,.1f}")),
        ("waiting", str(panel["waiting"]), "prefix cache", percent(panel["prefix_cache_hit_rate"])),
        ("preempted", optional(panel["preemptions"], "{:,.0f}"), "rates over", over),
    ]
    lines = [f"Capacity  {panel['verdict']}"] + [f"  {a:<14}{b:>10}    {c:<14}{d}" for a, b, c, d in rows]
    return "\n".join(lines)


def keys(rows: Sequence[Mapping[str, Any]], you: Mapping[str, Any] | None = None) -> str:
    """Every key's usage for an admin key; an ordinary key's own, said so in the title."""
    title = f"Keys (yours, {you['key']}: an admin key sees every key's)" if you and not you["admin"] else "Keys"
    if not rows:
        return f"{title}\n  no request yet"
    columns = ("requests", "input_tokens", "cached_tokens", "output_tokens", "errors")
    width = max(12, *(len(row["name"]) for row in rows))
    head = (
        f"  {'KEY':<{width}}"
        + "".join(f"{title:>12}" for title in ("REQUESTS", "INPUT", "CACHED", "OUTPUT", "ERRORS", "COST"))
        + "  SINCE"
    )
    body = []
    for row in rows:
        counts = "".join(f"{row[column]:>12,}" for column in columns)
        body.append(f"  {row['name']:<{width}}{counts}{dollars(row.get('cost')):>12}  {row.get('since') or '-'}")
        body += [f"    budget {budget_line(standing)}" for standing in row.get("budgets", ())]
    return "\n".join([title, head, *body])


def budget_line(standing: Mapping[str, Any]) -> str:
    """`$5.00 a day: 82% used, resets 2026-12-05T00:00:00Z` (a key's budget, VL_API_KEYS)."""
    return f"{standing['budget']}: {standing['utilization']:.0%} used, resets {standing['resets_at']}"


def sessions(shown: Sequence[Mapping[str, Any]]) -> str:
    """Each session seen last, an agent a row (subagents under the agent that started them)."""
    if not shown:
        return "Claude Code sessions\n  none yet (Claude Code names them in x-claude-code-session-id)"
    titles = ("REQUESTS", "INPUT", "CACHED", "OUTPUT", "HIT", "TTFT p50", "COST")
    lines = [
        "Claude Code sessions (the last seen first)",
        "  " + f"{'AGENT':<30}" + "".join(f"{t:>11}" for t in titles),
    ]
    for session in shown:
        lines.append(f"  session {session['id']}  (seen {session['seen_s_ago']:.0f} s ago)")
        for agent in session["agents"]:
            name = agent["agent"] if agent["parent"] is None else f"  └ {agent['agent']}"
            compactions = f" ({agent['compactions']} compactions)" if agent["compactions"] else ""
            misses = ", ".join(f"{why} x{n}" for why, n in (agent.get("cache_misses") or {}).items())
            compactions += f" (cache missed: {misses})" if misses else ""
            cells = (
                f"{agent['requests']:,}",
                f"{agent['input_tokens']:,}",
                f"{agent['cached_tokens']:,}",
                f"{agent['output_tokens']:,}",
                percent(agent["prefix_cache_hit_rate"]),
                seconds(agent["ttft_p50_s"]),
                dollars(agent["cost"]),
            )
            lines.append(f"    {name[:28]:<28}" + "".join(f"{cell:>11}" for cell in cells) + compactions)
    return "\n".join(lines)


def gpus(state: Mapping[str, Any]) -> str:
    found = state["gpus"]
    note = [f"  {state['gpu_note']}"] if state["gpu_note"] else []
    if not found:
        return "\n".join(["GPUs", *(note or ["  none reported"])])
    width = max(len(gpu["name"]) for gpu in found)
    head = (
        f"  {'#':<3}{'NAME':<{width}}  {'UTIL':>5}  {'MEMORY (MiB)':>19}  {'TEMP':>5}  {'POWER':>7}  UTIL, LAST 2 MIN"
    )
    body = [
        f"  {gpu['index']:<3}{gpu['name']:<{width}}  {gpu['utilization_pct']:>4.0f}%  "
        f"{gpu['memory_used_mib']:>8,.0f} / {gpu['memory_total_mib']:>8,.0f}  "
        f"{optional(gpu['temperature_c'], '{:.0f}°C'):>5}  {optional(gpu['power_w'], '{:.0f} W'):>7}  "
        f"{sparkline([point['utilization_pct'] for point in gpu['history']])}"
        for gpu in found
    ]
    return "\n".join(["GPUs", head, *body, *note])


def cost(data: Mapping[str, Any]) -> str:
    if data["per_hour"] is None:
        return "Cost\n  not set (VL_COST_PER_HOUR)"
    per_million = data["per_million_output_tokens"]
    rate = f"${per_million:,.2f} per million output tokens at the current rate" if per_million else "no output yet"
    return f"Cost\n  ${data['per_hour']:,.2f}/h    so far ${data['so_far']:,.2f}    {rate}"


def sparkline(values: Sequence[float], width: int = 30) -> str:
    """The last `width` percentages as bars (0 to 100 %)."""
    return "".join(SPARK[min(len(SPARK) - 1, int(max(0.0, v) / 100 * len(SPARK)))] for v in values[-width:])


def dollars(value: float | None) -> str:
    return "-" if value is None else f"${value:,.4f}"


def optional(value: float | None, form: str = "{:,}") -> str:
    return "-" if value is None else form.format(value)


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def duration(total_s: float) -> str:
    minutes, secs = divmod(int(total_s), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h {minutes:02d}m" if days else f"{hours}h {minutes:02d}m {secs:02d}s"
