"""`python -m runtime bridge --upstream URL [--host H] [--port P]`: serve the bridge with uvicorn.

Settings come from the VL_* environment (`runtime.settings`); a bad one stops the start with one
line. `--port 0` picks a free port and logs it (tests run many bridges side by side).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import uvicorn

from runtime.bridge.app import Bridge, create_app
from runtime.settings import SettingsError, load_settings

log = logging.getLogger("runtime.bridge")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--upstream", required=True, help="vLLM's OpenAI server, e.g. http://127.0.0.1:18081")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on; 0 = a free one (default: 8080)")
    parser.add_argument("--max-connections", type=int, default=512,
                        help="upstream connection pool size (default: 512)")  # fmt: skip
    parser.add_argument("--pool-timeout", type=float, default=10.0,
                        help="seconds to wait for a free upstream connection before answering 529 (default: 10)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        settings = load_settings(os.environ)
    except SettingsError as error:
        print(error, file=sys.stderr)
        return 2
    bridge = Bridge(args.upstream, settings, args.max_connections, args.pool_timeout)
    if bridge.keys.open:
        log.warning("=" * 72)
        log.warning("VL_API_KEYS is empty: the bridge is OPEN, anyone who can reach it can use the model")
        log.warning("=" * 72)
    else:
        log.info("API keys required (%d configured)", len(bridge.keys.keys))
    config = uvicorn.Config(
        create_app(bridge), host=args.host, port=args.port, access_log=False, log_level="info",
        timeout_graceful_shutdown=5,
    )  # fmt: skip
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1
