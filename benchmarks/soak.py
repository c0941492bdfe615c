"""Soak: streaming clients for N minutes against the bridge in front of the stand-in upstream, some
reading to the end, some leaving mid-stream, some stalling (not reading) a while before they read on
or vanish; every client comes back with a new request at once. What leaks shows at the end.

    python benchmarks/soak.py --minutes N [--clients 64] [--max-stall-s 20] [--seed 0]

Prints the bridge's resident memory, open file descriptors and TCP connections to the upstream,
and its `bridge_open_streams` and `bridge_upstream_connections_in_use` gauges: at the start (after
a warm-up round, once idle upstream connections closed), every minute, at the end of the load, and
once settled again; then what the clients saw and what the upstream and the bridge's log say.
Exits 1 when the bridge died, logged a traceback or left a stream hanging, or when, settled, it
holds more files than at the start, any upstream connection, or an open stream.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import socket
import sys
import time
import urllib.request
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the bridge and the stand-in are started the tests' way, logs kept
from tests.support.bridge import Process, start_bridge, start_stand_in  # noqa: E402

PACE_MS = 10  # the stand-in's time per token
# Most streams short (20-400 tokens: 0.2-4 s), a quarter long (10-30 s): longer than what the
# bridge's buffers hold, so that a client stalling in one pushes back on the bridge and the upstream.
SHORT, LONG, LONG_SHARE = (20, 400), (1000, 3000), 0.25
KEYS = [f"soak-{n}:sk-soak-{n}-0123456789" for n in range(8)]  # clients share 8 keys: a per-key cap sees a fair load
CLIENT_BUFFER = 4096  # bytes a client's socket and reader hold: a stalled client pushes back at once
SETTLE_S = 60.0  # longest wait for the bridge's idle upstream connections to close
PATIENCE_S = 120.0  # a stream silent this long past its stall is counted as hung
ENDS = {"/v1/messages": b"message_stop", "/v1/chat/completions": b"data: [DONE]"}
# (behaviour, weight): read to the end; leave mid-stream; stall, then read on or vanish.
BEHAVIOURS = [("read", 5), ("leave", 2), ("stall", 2), ("vanish", 1)]
TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2", "06": "TIME_WAIT",
              "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}  # fmt: skip


# --- the bridge from outside ---


@dataclass
class Figures:
    """What the bridge holds at one moment."""

    rss_mb: float
    fds: int
    upstream: Counter[str]  # its TCP connections to the upstream port, by state
    gauges: dict[str, float]

    def line(self) -> str:
        states = ", ".join(f"{state} {n}" for state, n in sorted(self.upstream.items()))
        return (f"rss {self.rss_mb:.1f} MB, fds {self.fds}, upstream connections {self.upstream.total()}"
                f"{f' ({states})' if states else ''}, open streams {self.gauges.get('bridge_open_streams', -1):g}, "
                f"upstream in use {self.gauges.get('bridge_upstream_connections_in_use', -1):g}")  # fmt: skip


def rss_mb(pid: int) -> float:
    """VmRSS of /proc/<pid>/status, in MB."""
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process `pid` has open."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with suppress(FileNotFoundError):  # closed meanwhile
            target = fd.readlink().name
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def connections_to(pid: int, port: int) -> Counter[str]:
    """Process `pid`'s TCP connections whose remote end is `port` on this host, by state:
    /proc/<pid>/net/tcp lists the namespace's sockets, its fds say which are the process's."""
    mine, states = socket_inodes(pid), Counter[str]()
    for row in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        if int(fields[2].split(":")[1], 16) == port and fields[9] in mine:
            states[TCP_STATES.get(fields[3], fields[3])] += 1
    return states


def gauges(bridge: Process, key: str) -> dict[str, float]:
    """The bridge's own gauges from its /metrics."""
    ask = urllib.request.Request(bridge.url + "/metrics", headers={"x-api-key": key})
    with urllib.request.urlopen(ask, timeout=30) as answer:
        text = answer.read().decode()
    return {name: float(value) for name, _, value in (line.partition(" ") for line in text.splitlines())
            if name in ("bridge_open_streams", "bridge_upstream_connections_in_use")}  # fmt: skip


def figures(bridge: Process, upstream_port: int, key: str) -> Figures:
    pid = bridge.process.pid
    return Figures(
        rss_mb(pid),
        len(list(Path(f"/proc/{pid}/fd").iterdir())),
        connections_to(pid, upstream_port),
        gauges(bridge, key),
    )


async def settled(bridge: Process, upstream_port: int, key: str) -> tuple[Figures, float]:
    """The figures once the bridge holds no upstream connection (idle ones time out), or after
    SETTLE_S; and how long that took."""
    started = time.monotonic()
    while connections_to(bridge.process.pid, upstream_port) and time.monotonic() - started < SETTLE_S:
        await asyncio.sleep(0.25)
    return figures(bridge, upstream_port, key), time.monotonic() - started


# --- the clients ---


def request(port: int, route: str, key: str, tokens: int) -> bytes:
    """A streamed request on `route`, closing the connection after its answer."""
    if route == "/v1/messages":
        payload = {
            "model": "claude-fake",
            "max_tokens": tokens,
            "stream": True,
            "messages": [{"role": "user", "content": "soak"}],
        }
    else:
        payload = {"max_tokens": tokens, "stream": True, "messages": [{"role": "user", "content": "soak"}]}
    body = json.dumps(payload).encode()
    head = (f"POST {route} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\nx-api-key: {key}\r\n"
            f"anthropic-version: 2023-06-01\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n")  # fmt: skip
    return head.encode() + body


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection whose receive buffers are small, so that not reading stops the bridge's writes."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_BUFFER)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock, limit=CLIENT_BUFFER)


async def read(reader: asyncio.StreamReader, tail: bytes, limit: float = float("inf")) -> bytes:
    """Read until `limit` bytes in all, or until the bridge closes; the last bytes seen."""
    seen = 0
    while seen < limit and (data := await reader.read(65536)):
        seen += len(data)
        tail = (tail + data)[-256:]
    return tail


def ending(route: str, tail: bytes, stalled: bool) -> str:
    """`completed` when the stream ended with its last event and the last HTTP chunk, else `cut`."""
    whole = tail.endswith(b"0\r\n\r\n") and ENDS[route] in tail
    return ("completed" if whole else "cut") + (" after a stall" if stalled else "")


async def one_stream(port: int, route: str, key: str, rng: random.Random, behaviour: str, max_stall_s: float) -> str:
    """Run one stream as `behaviour` says; its outcome: completed, left, vanished, cut (ended by the
    bridge without its last event), each maybe `after a stall`, or `refused <status>`."""
    reader, writer = await connect(port)
    try:
        writer.write(request(port, route, key, rng.randint(*(LONG if rng.random() < LONG_SHARE else SHORT))))
        status = int((await reader.readuntil(b"\r\n\r\n")).split()[1])
        if status != 200:
            return f"refused {status}"
        tail = await read(reader, b"", rng.randint(200, 3000))  # a few events in: mid-stream
        if reader.at_eof() or behaviour == "read":
            return ending(route, await read(reader, tail), stalled=False)
        if behaviour == "leave":
            return "left"
        await asyncio.sleep(rng.uniform(1, max_stall_s))
        return "vanished" if behaviour == "vanish" else ending(route, await read(reader, tail), stalled=True)
    except (ConnectionError, asyncio.IncompleteReadError):
        return "cut"
    finally:
        writer.transport.abort()  # leaving: unread data in the socket makes it a reset, as a killed client's


async def client(n: int, port: int, deadline: float, outcomes: Counter[str], seed: int, max_stall_s: float) -> None:
    """One client: a stream after another until `deadline`, each with a behaviour drawn at random."""
    rng = random.Random(seed * 1000 + n)
    key = KEYS[n % len(KEYS)].split(":", 1)[1]
    names, weights = zip(*BEHAVIOURS, strict=True)
    while time.monotonic() < deadline:
        behaviour = rng.choices(names, weights)[0]
        route = "/v1/messages" if rng.random() < 0.75 else "/v1/chat/completions"
        try:
            async with asyncio.timeout(max_stall_s + PATIENCE_S):
                outcomes[await one_stream(port, route, key, rng, behaviour, max_stall_s)] += 1
        except TimeoutError:
            outcomes["hung"] += 1


# --- the run ---


def log_counts(upstream: Process, bridge: Process) -> str:
    up, log = upstream.log(), bridge.log()
    return (f"upstream: {up.count('stream dropped by its client')} streams dropped by their client, "
            f"{up.count('abort requested')} aborts asked; bridge log: {log.count('Traceback')} tracebacks, "
            f"{log.count('stop=client_gone')} client_gone, {log.count('client_stalled')} client_stalled")  # fmt: skip


async def soak(args: argparse.Namespace, upstream: Process, bridge: Process) -> int:
    port, upstream_port = int(bridge.url.rsplit(":", 1)[1]), int(upstream.url.rsplit(":", 1)[1])
    key = KEYS[0].split(":", 1)[1]
    print(f"soak: {args.clients} clients for {args.minutes:g} min; bridge pid {bridge.process.pid}, stand-in at {PACE_MS} ms a token; "
          f"stalls up to {args.max_stall_s:g} s", flush=True)  # fmt: skip
    await asyncio.gather(
        *(one_stream(port, "/v1/messages", key, random.Random(n), "read", 0) for n in range(args.clients))
    )
    start, waited = await settled(bridge, upstream_port, key)
    print(f"start    {start.line()} (settled in {waited:.1f} s)", flush=True)
    outcomes: Counter[str] = Counter()
    began = time.monotonic()
    deadline = began + args.minutes * 60
    load = asyncio.gather(
        *(client(n, port, deadline, outcomes, args.seed, args.max_stall_s) for n in range(args.clients))
    )
    while not load.done():
        await asyncio.wait([load], timeout=60)
        if not load.done():
            minute = (time.monotonic() - began) / 60
            print(f"{minute:4.1f} min {figures(bridge, upstream_port, key).line()}; {summary(outcomes)}", flush=True)
    end = figures(bridge, upstream_port, key)
    print(f"end      {end.line()}", flush=True)
    after, waited = await settled(bridge, upstream_port, key)
    print(f"settled  {after.line()} (in {waited:.1f} s)", flush=True)
    print(f"clients: {summary(outcomes)}", flush=True)
    print(log_counts(upstream, bridge), flush=True)
    return verdict(bridge, outcomes, start, after)


def summary(outcomes: Counter[str]) -> str:
    """The clients' outcomes in one line: completed, aborted by the client, cut by the bridge, refused."""
    refused = {name[8:]: n for name, n in sorted(outcomes.items()) if name.startswith("refused")}
    return (f"{outcomes.total()} requests: {outcomes['completed'] + outcomes['completed after a stall']} completed "
            f"({outcomes['completed after a stall']} after a stall), {outcomes['left'] + outcomes['vanished']} aborted by "
            f"their client ({outcomes['left']} left mid-stream, {outcomes['vanished']} vanished while stalled), "
            f"{outcomes['cut'] + outcomes['cut after a stall']} cut by the bridge ({outcomes['cut after a stall']} after a stall), "
            f"{outcomes['hung']} hung, {sum(refused.values())} refused {refused}")  # fmt: skip


def verdict(bridge: Process, outcomes: Counter[str], start: Figures, after: Figures) -> int:
    """1, with the reasons, when the bridge died, logged a traceback, left a stream hanging, or kept
    more than it held at the start once settled (files, upstream connections, open streams)."""
    kept = after.fds > start.fds or after.upstream.total() > 0 or any(after.gauges.values())
    problems = [reason for reason, bad in (("the bridge died", bridge.process.poll() is not None),
                                           ("tracebacks in the bridge's log", "Traceback" in bridge.log()),
                                           ("hung streams", outcomes["hung"] > 0),
                                           ("the bridge kept files, connections or streams", kept)) if bad]  # fmt: skip
    if problems:
        print(f"FAILED: {', '.join(problems)}", flush=True)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, required=True, help="how long the clients run")
    parser.add_argument("--clients", type=int, default=64, help="concurrent streaming clients (default: 64)")
    parser.add_argument(
        "--max-stall-s", type=float, default=20.0, help="longest time a stalling client stops reading (default: 20)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the clients' choices (default: 0)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped soak still stops what it started
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with TemporaryDirectory(prefix="soak-") as directory:
        logs = Path(directory)
        with (start_stand_in(logs / "upstream.log", "--tokens", "100000", "--pace-ms", str(PACE_MS)) as upstream,
              start_bridge(upstream.url, logs / "bridge.log", {"VL_API_KEYS": ",".join(KEYS)}) as bridge):  # fmt: skip
            return asyncio.run(soak(args, upstream, bridge))


if __name__ == "__main__":
    sys.exit(main())
