"""`python -m runtime bridge --upstream URL [--host H] [--port P]`: serve the bridge with uvicorn.

Settings come from the VL_* environment (`runtime.settings`); a bad one stops the start with one
line. `--port 0` picks a free port and logs it (tests run many bridges side by side).

The HTTP implementation is pinned: `GuardedHttp`, uvicorn's httptools protocol with bounds on
reading a request (runtime.bridge.connection), never left to uvicorn's "auto". So is the WebSocket
one: none. The bridge relays no WebSocket, so an upgrade is answered as the plain GET it also is (401
without a valid key), traced and counted like any request, and its connection closed; with "auto" it
went to the `websockets` library that vLLM brings (403, and two log lines per stranger, never summarised).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import resource
import sys
from pathlib import Path

import uvicorn

from runtime.bridge.app import create_app
from runtime.bridge.connection import GuardedHttp, ReadLimits
from runtime.bridge.state import Bridge
from runtime.settings import SettingsError, load_settings

log = logging.getLogger("runtime.bridge")

# Longer than clients' own keep-alive (Node 4 s, httpx 5 s), so that they close first and never send a
# request into the bridge's close; idle connections are the first closed when connections run short.
KEEP_ALIVE_S = 75
HEAD_TIMEOUT_S = 20.0  # a real client sends its head at once; a slow one gets this long in all
BODY_TIMEOUT_S = 30.0  # for a body's first bytes, and its slack thereafter (it must then keep up BODY_MIN_RATE)
CLIENTS_PER_UPSTREAM_SLOT = 4  # connections allowed per slot of the engine's pool: idle ones of many users fit
FILES_SPARE = 64  # open files besides connections: logs, the event loop, the listening socket, pipes


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--upstream", required=True, help="vLLM's OpenAI server, e.g. http://127.0.0.1:18081")
    parser.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="URL",
        help="an engine behind the router that --upstream names (repeat for each): aborts, /tokenize, "
        "/v1/models and /metrics go to the engines directly",
    )
    parser.add_argument(
        "--thinks-unasked",
        action="store_true",
        help="keep the chat template's thinking default for a request without `thinking` (the "
        "recipe's thinks_unasked); else it gets none, as from Anthropic's API",
    )
    parser.add_argument(
        "--data-parallel",
        type=int,
        default=1,
        metavar="N",
        help="the engine's data-parallel ranks (VL_DP): each conversation is pinned to one (X-data-parallel-rank)",
    )
    parser.add_argument(
        "--ledger",
        type=Path,
        metavar="FILE",
        help="keep each key's usage totals in FILE across restarts (the pod's: on its volume)",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on; 0 = a free one (default: 8080)")
    parser.add_argument("--max-connections", type=int, default=512, help="upstream connection pool size (default: 512)")
    parser.add_argument(
        "--pool-timeout",
        type=float,
        default=10.0,
        help="seconds to wait for a free upstream connection before answering 529 (default: 10)",
    )
    parser.add_argument(
        "--keep-alive-s",
        type=int,
        default=KEEP_ALIVE_S,
        help=f"seconds a client connection may idle (default: {KEEP_ALIVE_S})",
    )
    parser.add_argument(
        "--head-timeout-s",
        type=float,
        default=HEAD_TIMEOUT_S,
        help=f"seconds a client may take to send a request's head (default: {HEAD_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--body-timeout-s",
        type=float,
        default=BODY_TIMEOUT_S,
        help=f"seconds a body may lag behind 8 KiB/s (default: {BODY_TIMEOUT_S:g})",
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        settings = load_settings(os.environ)
    except SettingsError as error:
        print(error, file=sys.stderr)
        return 2
    bridge = Bridge(
        args.upstream,
        settings,
        args.max_connections,
        args.pool_timeout,
        args.engine,
        args.ledger,
        args.thinks_unasked,
        max(1, args.data_parallel),
    )
    if bridge.keys.open:
        log.warning("=" * 72)
        log.warning("VL_API_KEYS is empty: the bridge is OPEN, anyone who can reach it can use the model")
        log.warning(
            "against web pages: POST bodies must be application/json (else 415), and Host %s (else 403; "
            "VL_ALLOWED_HOSTS adds names)",
            bridge.hosts.describe(),
        )
        log.warning("=" * 72)
    else:
        log.info("API keys required (%d configured)", len(bridge.keys.keys))
    limits = ReadLimits(
        args.head_timeout_s, args.body_timeout_s, connection_cap(args.max_connections, open_files_limit())
    )
    log.info("at most %d client connections", limits.max_connections)
    config = uvicorn.Config(
        create_app(bridge),
        host=args.host,
        port=args.port,
        access_log=False,
        log_level="info",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=args.keep_alive_s,
        http=functools.partial(GuardedHttp, limits=limits),  # type: ignore[arg-type]  # uvicorn calls it as a class
        ws="none",  # an upgrade is served as HTTP: no WebSocket code is reachable from the public port
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1


def open_files_limit() -> int:
    """This process's limit of open files, first raised to the hard limit: each connection is a file,
    and the soft default (often 1024) is what made `/health` fail under 200 idle connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 2**20)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return wanted
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):
        return soft
    return wanted


def connection_cap(pool: int, open_files: int) -> int:
    """Client connections allowed: a few per slot of the upstream pool, and at most half the files
    left (each client connection may hold an upstream one), so that accepting one never fails."""
    return max(1, min(CLIENTS_PER_UPSTREAM_SLOT * pool, (open_files - FILES_SPARE) // 2))
