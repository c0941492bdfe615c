"""`python -m runtime status` (issue 12): the console as a terminal table, for a known state and against a
real bridge in front of the session's real vLLM, its key row matching what the anthropic SDK was told."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from runtime.client.status import REDRAW, render
from runtime.engine import tinymodel as tiny
from tests.support.bridge import ROOT, start_bridge
from tests.support.environ import outer_environ
from tests.support.sdk import anthropic
from tests.support.vllm_server import VllmServer

KEY = "sk-console-0123456789abcdef"

HEALTHY = {
    "model": {"name": "qwen3-coder-30b", "context_window": 131072},
    "engine": {"state": "healthy", "boot_log": []},
    "uptime_s": 3725.4,
    "image": {"target": "sm120", "revision": "83c465b", "date": "2026-11-30", "cuda": "13.0",
              "versions": {"vllm": "0.32.0", "torch": "2.13.0", "fastokens": "0.4.1"}},
    "traffic": {"requests_per_min": 12.4, "open_streams": 2, "running": 2, "waiting": 0,
                "output_tokens_per_s": 85.25, "ttft_p50_s": 0.412, "ttft_p95_s": 1.9, "prompt_tokens": 1234567,
                "cached_tokens": 1150000, "prefix_cache_hit_rate": 0.9315, "window_s": 300},
    "capacity": {"running": 5, "waiting": 0, "waiting_for_capacity": 0, "kv_use": 0.41, "over_s": 60.0,
                 "prefill_tokens_per_s": 2730.4, "decode_tokens_per_s": 85.2, "prefix_cache_hit_rate": 0.9315,
                 "preemptions": 0,
                 "verdict": "prefill-bound: 12 requests re-reading 148.2k-token contexts, 93% from the prefix cache "
                            "(2,730 prompt tokens/s computed, 85 generated)"},
    "keys": [{"name": "alice", "since": "2026-11-28T09:12:00Z", "requests": 120, "input_tokens": 84500,
              "cached_tokens": 1150000, "output_tokens": 23456, "errors": 1, "busy_s": 1800.0, "cost": 0.345,
              "budgets": [{"budget": "$5.00 a day", "unit": "usd", "period": "day", "limit": 5.0, "spent": 4.1,
                           "utilization": 0.82, "resets_at": "2026-12-05T00:00:00Z"}]},
             {"name": "hmac:3f2a9c0d1e4b", "since": "2026-12-01T18:00:05Z", "requests": 3, "input_tokens": 900,
              "cached_tokens": 0, "output_tokens": 120, "errors": 0, "busy_s": 2.5, "cost": 0.000479}],
    "sessions": [{"id": "c0ffee00-1111-4222-8333-444455556666", "seen_s_ago": 4.2, "agents": [
        {"agent": "main", "parent": None, "key": "alice", "requests": 14, "classes": {"main": 13, "compaction": 1},
         "compactions": 1, "input_tokens": 52000, "cached_tokens": 610000, "output_tokens": 9100,
         "prefix_cache_hit_rate": 0.9215, "ttft_p50_s": 0.52, "busy_s": 95.0, "cost": 0.018208},
        {"agent": "a1b2c3d4e5f6a7b8c", "parent": "main", "key": "alice", "requests": 6, "classes": {"subagent": 6},
         "compactions": 0, "input_tokens": 21000, "cached_tokens": 88000, "output_tokens": 2400,
         "prefix_cache_hit_rate": 0.8073, "cache_misses": {"evicted": 1, "system_changed": 2}, "ttft_p50_s": 1.31, "busy_s": 30.5, "cost": 0.005846}]}],
    "gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 5090", "utilization_pct": 87.0, "memory_used_mib": 28812.0,
              "memory_total_mib": 32607.0, "temperature_c": 43.0, "power_w": 99.0,
              "history": [{"t": 1000.0 + 2 * i, "utilization_pct": float(u), "memory_used_mib": 28812.0}
                          for i, u in enumerate([0, 0, 10, 40, 87, 100, 95, 87])]}],
    "gpu_note": None,
    "cost": {"per_hour": 0.69, "so_far": 0.714, "per_million_output_tokens": 2.2483},
}  # fmt: skip

HEALTHY_TEXT = """\
Model   qwen3-coder-30b (window 131,072 tokens)
Engine  healthy
Up      1h 02m 05s
Image   target=sm120  revision=83c465b  date=2026-11-30  cuda=13.0  vllm=0.32.0  torch=2.13.0

Traffic (last 5 min)
  requests/min        12.4    open streams  2
  output tok/s        85.2    vLLM running  2
  TTFT p50          0.41 s    vLLM waiting  0
  TTFT p95          1.90 s    prefix cache  93.2% of 1,234,567 prompt tokens

Capacity  prefill-bound: 12 requests re-reading 148.2k-token contexts, 93% from the prefix cache (2,730 prompt tokens/s computed, 85 generated)
  KV cache             41%    prefill tok/s 2,730
  running                5    decode tok/s  85.2
  waiting                0    prefix cache  93%
  preempted              0    rates over    last 60 s

Keys
  KEY                  REQUESTS       INPUT      CACHED      OUTPUT      ERRORS        COST  SINCE
  alice                     120      84,500   1,150,000      23,456           1     $0.3450  2026-11-28T09:12:00Z
    budget $5.00 a day: 82% used, resets 2026-12-05T00:00:00Z
  hmac:3f2a9c0d1e4b           3         900           0         120           0     $0.0005  2026-12-01T18:00:05Z

Claude Code sessions (the last seen first)
  AGENT                            REQUESTS      INPUT     CACHED     OUTPUT        HIT   TTFT p50       COST
  session c0ffee00-1111-4222-8333-444455556666  (seen 4 s ago)
    main                                 14     52,000    610,000      9,100        92%     0.52 s    $0.0182 (1 compactions)
      └ a1b2c3d4e5f6a7b8c                 6     21,000     88,000      2,400        81%     1.31 s    $0.0058 (cache missed: evicted x1, system_changed x2)

GPUs
  #  NAME                      UTIL         MEMORY (MiB)   TEMP    POWER  UTIL, LAST 2 MIN
  0  NVIDIA GeForce RTX 5090    87%    28,812 /   32,607   43°C     99 W  ▁▁▁▄▇██▇

Cost
  $0.69/h    so far $0.71    $2.25 per million output tokens at the current rate"""


def test_a_healthy_pod_renders_as_this_table():
    assert render(HEALTHY) == HEALTHY_TEXT


def test_a_starting_pod_shows_its_engine_log_without_terminal_controls():
    starting = HEALTHY | {
        "model": None,
        "engine": {"state": "starting", "boot_log": ["Loading weights 40%", "\x1b]52;c;cm0gLXJm\x07\x1b[2Jdone"]},
        "image": None,
        "keys": [],
        "sessions": [],
        "capacity": None,
        "gpus": [],
        "gpu_note": "no GPU on this machine (nvidia-smi not found)",
        "cost": {"per_hour": None, "so_far": None, "per_million_output_tokens": None},
        "uptime_s": 12.0,
    }
    text = render(starting)
    assert text.startswith(
        "Model   not known yet\nEngine  starting\nUp      0h 00m 12s\nImage   not prebaked (installed at start)\n\n"
        "Engine log (last lines)\n  Loading weights 40%\n  done\n\nTraffic (last 5 min)\n"
    )
    assert "\n\nCapacity\n  no engine metrics yet\n\n" in text
    assert text.endswith(
        "Keys\n  no request yet\n\n"
        "Claude Code sessions\n  none yet (Claude Code names them in x-claude-code-session-id)\n\n"
        "GPUs\n  no GPU on this machine (nvidia-smi not found)\n\n"
        "Cost\n  not set (VL_COST_PER_HOUR)"
    )


def status_command(url: str, *options: str) -> subprocess.CompletedProcess[str]:
    environ = outer_environ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
    return subprocess.run([sys.executable, "-m", "runtime", "status", url, *options], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_the_command_shows_a_real_bridge_and_never_its_key(vllm_server: VllmServer, tmp_path: Path):
    settings = {"VL_API_KEYS": f"console:{KEY}", "VL_COST_PER_HOUR": "0.01", "VL_STATE_DIR": str(tmp_path / "state")}
    with start_bridge(vllm_server.url, tmp_path / "bridge.log", settings) as bridge:
        client = anthropic.Anthropic(base_url=bridge.url, api_key=KEY, max_retries=0)
        prompt = [{"role": "user", "content": tiny.MARK_TEXT}]
        told = [client.messages.create(model="claude-any", max_tokens=20, messages=prompt).usage for _ in range(2)]
        shown = status_command(bridge.url, "--key", KEY)
        refused = status_command(bridge.url)
        watched, watch_status = watch_twice(bridge.url)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "Engine  healthy" in lines and any(line.startswith("Model   ") and "window" in line for line in lines)
    key_row = next(line.split() for line in lines if line.startswith("  console "))
    told_in, told_out = sum(u.input_tokens for u in told), sum(u.output_tokens for u in told)
    told_cached = sum(u.cache_read_input_tokens or 0 for u in told)
    assert told_in > 0 and told_out > 0
    assert key_row[:6] == ["console", "2", f"{told_in:,}", f"{told_cached:,}", f"{told_out:,}", "0"]  # errors
    assert key_row[6] == "$0.0000" and key_row[7].startswith(f"{datetime.now(UTC):%Y-%m-%d}T")  # cost, since
    assert "  $0.01/h    so far $0.00    " in shown.stdout  # a cent an hour: $0.00 for the test's whole run
    assert KEY not in shown.stdout + shown.stderr
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr == (
        f"{bridge.url}/v1/pod/status answered 401: an API key is required: send Authorization: Bearer <key> or "
        "x-api-key: <key>\n"
    )
    assert watch_status == 0 and watched.count(REDRAW) >= 2 and "Engine  healthy" in watched  # Ctrl-C ends it


def watch_twice(url: str) -> tuple[str, int]:
    """`--watch` until it has drawn the table twice, then Ctrl-C (SIGINT): its output and exit status.
    The key comes from ANTHROPIC_AUTH_TOKEN, as in Claude Code's environment."""
    environ = outer_environ("ANTHROPIC_API_KEY") | {"ANTHROPIC_AUTH_TOKEN": KEY}
    process = subprocess.Popen([sys.executable, "-m", "runtime", "status", url, "--watch"], cwd=ROOT, env=environ,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    assert process.stdout is not None
    seen = b""
    while seen.decode(errors="replace").count(REDRAW) < 2 and process.poll() is None:
        seen += os.read(process.stdout.fileno(), 65536)
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=60)  # a watch that Ctrl-C does not end fails here, not at the suite's limit
    return (seen + rest).decode(), process.returncode
