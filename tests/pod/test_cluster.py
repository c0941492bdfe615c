"""A node of a RunPod Instant Cluster: RunPod's variables read and refused in one line, the interface that holds the
node's address, the ranks agents move to while a node is lost, and rank 0's node link through a node's loss and
return, over a real supervisor and child process (the two-container test in tests/build runs it on vLLM)."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runtime.bridge.affinity import data_parallel_rank
from runtime.cluster import ClusterNode, cluster_node, interface_of
from runtime.engine.command import engine_command
from runtime.logfiles import ENGINE
from runtime.pod.nodelink import LOST_AFTER_S, NodeLink, NodeWatch, TransportNote
from runtime.pod.supervisor import ChildSpec, Health, Supervisor
from runtime.settings import SettingsError, load_settings
from runtime.state.dpranks import DownRanks
from runtime.state.enginehealth import read_engine_health
from tests.support.net import free_port
from tests.support.polling import eventually

HEAD = {"NUM_NODES": "2", "NODE_RANK": "0", "PRIMARY_ADDR": "127.0.0.1", "PRIMARY_PORT": "29500",
        "NODE_ADDR": "127.0.0.1", "NUM_TRAINERS": "8"}  # fmt: skip


def test_a_pod_outside_a_cluster_has_no_place_and_a_node_reads_runpod_s_variables() -> None:
    assert cluster_node({}) is None
    assert cluster_node(HEAD) == ClusterNode(2, 0, "127.0.0.1", 29500, "127.0.0.1", 8)
    worker = cluster_node(HEAD | {"NODE_RANK": "1", "NODE_ADDR": "10.65.0.3", "PRIMARY_ADDR": "10.65.0.2"})
    assert worker is not None and not worker.head and worker.link_port == 29501


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"NUM_NODES": "1"}, "NUM_NODES='1' is not allowed: expected a whole number in 2..64"),
        ({"NODE_RANK": "2"}, "NODE_RANK='2' is not allowed: expected a whole number in 0..1 (NUM_NODES=2)"),
        ({"PRIMARY_ADDR": "head.example.invalid"}, "PRIMARY_ADDR='head.example.invalid' is not allowed"),
        ({"PRIMARY_PORT": "65535"}, "PRIMARY_PORT='65535' is not allowed: expected a whole number in 1024..65534"),
        (
            {"NODE_ADDR": "10.65.0.3"},
            "NODE_ADDR='10.65.0.3' is not allowed: expected PRIMARY_ADDR (127.0.0.1) on rank 0",
        ),
        ({"NUM_TRAINERS": "0"}, "NUM_TRAINERS='0' is not allowed"),
    ],
)
def test_a_wrong_cluster_variable_is_refused_in_one_line_naming_it(change: dict[str, str], line: str) -> None:
    with pytest.raises(SettingsError) as refused:
        cluster_node(HEAD | change)
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value)


def test_a_missing_variable_is_named_as_runpod_s() -> None:
    without = {name: value for name, value in HEAD.items() if name != "PRIMARY_ADDR"}
    with pytest.raises(SettingsError, match=r"PRIMARY_ADDR=.*RunPod sets it on every node of an Instant Cluster"):
        cluster_node(without)


def test_nccl_and_gloo_keep_to_the_interface_that_holds_the_node_s_address() -> None:
    assert interface_of("127.0.0.1") == "lo"
    with pytest.raises(SettingsError, match=r"NODE_ADDR='192\.0\.2\.99' .* one of this node's interfaces \(.*lo=127"):
        interface_of("192.0.2.99")


@pytest.mark.parametrize(
    ("settings", "node", "line"),
    [
        ({"VL_CLUSTER": "pp", "VL_DP": "2"}, {}, "VL_DP='2' is not allowed: expected 1 with VL_CLUSTER=pp"),
        ({"VL_REPLICAS": "2"}, {}, "VL_REPLICAS='2' is not allowed: expected 1 or auto on a cluster's node"),
        (
            {"VL_SWAP": "big:qwen", "VL_API_KEYS": "sk-cluster-0123456789abcdef"},
            {},
            "VL_SWAP='big:qwen' is not allowed: expected empty on a cluster",
        ),
        (
            {"VL_PORT": "29501"},
            {},
            "PRIMARY_PORT='29500' is not allowed: expected a port whose next one is free of VL_PORT",
        ),
    ],
)
def test_what_a_cluster_cannot_take_is_refused_before_vllm_starts(
    settings: dict[str, str], node: dict[str, str], line: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        engine_command(load_settings({"VL_MODEL": "tiny", **settings}), environ=HEAD | node)
    assert str(refused.value).startswith(line)


def test_auto_spreads_replicas_over_the_nodes_when_the_recipe_fits_one() -> None:
    command = engine_command(load_settings({"VL_MODEL": "tiny"}), environ=HEAD)
    assert (command.spread, command.data_parallel) == ("dp", 16)  # as many as each node's 8 GPUs hold: plan's split
    assert command.argv[command.argv.index("--data-parallel-size-local") + 1] == "8"
    command = engine_command(load_settings({"VL_MODEL": "tiny", "VL_DP": "2"}), environ=HEAD)
    assert (command.spread, command.data_parallel) == ("dp", 4)  # VL_DP set: that many on each of the 2 nodes
    assert command.argv[command.argv.index("--data-parallel-size") + 1] == "4"


def test_while_a_rank_is_down_only_its_agents_move() -> None:
    down = frozenset({1})
    for key in range(1000):
        rank = data_parallel_rank(key, 4, down)
        assert rank == key % 4 if key % 4 != 1 else rank in (0, 2, 3)
    assert data_parallel_rank(5, 2, frozenset({0, 1})) == 1  # none up: its own, vLLM says what it says


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class HeadEngine(Supervisor):
    """Rank 0's supervisor with an `engine` child (a process, no vLLM) whose probe answers `serving`: like vLLM's,
    a restarted one serves only once every node joined it, which a test says by turning `serving` on."""

    serving = True

    def launch(self) -> None:
        async def probe() -> bool:
            return self.serving

        argv = [sys.executable, "-c", "import time; time.sleep(600)"]
        self.start(ChildSpec(ENGINE, argv, health=Health(probe, 0.05, 5.0, 3, starting_interval_s=0.05)))


@pytest.fixture
async def head_engine(tmp_path: Path) -> AsyncIterator[HeadEngine]:
    supervisor = HeadEngine(tmp_path)
    supervisor.launch()
    await eventually(lambda: supervisor.is_healthy(ENGINE))
    yield supervisor
    await supervisor.stop()


FINGERPRINT = {"image": "cpu 0123abc", "VL_MODEL": "tiny", "NUM_NODES": "2"}


@pytest.mark.anyio
@pytest.mark.slow  # a real child process
async def test_rank_0_says_a_lost_node_in_one_line_and_restarts_its_engine_when_it_comes_back(
    tmp_path: Path, head_engine: HeadEngine
) -> None:
    node = cluster_node(HEAD)
    assert node is not None
    said: list[str] = []
    watch = NodeWatch(node, FINGERPRINT, head_engine, tmp_path, said.append, ranks_per_node=1)
    first = watch.epoch
    assert watch.heard({"rank": 1, "fingerprint": FINGERPRINT, "engine": "a1:1"}) == (200, {"epoch": first})
    watch.review()
    assert read_engine_health(tmp_path) == {"engine": "healthy", "node 1": "healthy"}

    watch.peers[1].heard = time.monotonic() - LOST_AFTER_S - 1  # its heartbeats stopped
    watch.review()
    watch.review()
    assert len(said) == 1 and said[0].startswith("cluster: node 1 lost at ") and "no heartbeat for 10 s" in said[0]
    assert read_engine_health(tmp_path)["node 1"].startswith("lost since ")
    assert DownRanks(tmp_path)() == {1}  # the bridge pins its agents elsewhere

    # Back with a new runtime: it gets no epoch until rank 0's engine restarted, so that it joins that start.
    head_engine.serving = False  # rank 0's next start waits for node 1
    assert watch.heard({"rank": 1, "fingerprint": FINGERPRINT, "engine": None}) == (200, {"epoch": None})
    watch.review()
    assert said[-1].startswith("cluster: node 1 back after ") and "rank 0's engine restarts" in said[-1]
    assert watch.heard({"rank": 1, "fingerprint": FINGERPRINT, "engine": None}) == (200, {"epoch": None})
    await eventually(lambda: watch.epoch != first)
    watch.review()
    assert read_engine_health(tmp_path)["node 1"].startswith("waiting since ")
    status, answer = watch.heard({"rank": 1, "fingerprint": FINGERPRINT, "engine": "b2:1"})
    assert (status, answer) == (200, {"epoch": watch.epoch})  # its engine starts for rank 0's new one
    head_engine.serving = True  # both joined: rank 0's engine serves
    await eventually(lambda: head_engine.is_healthy(ENGINE))
    watch.review()
    assert read_engine_health(tmp_path) == {"engine": "healthy", "node 1": "healthy"} and DownRanks(tmp_path)() == set()


@pytest.mark.anyio
@pytest.mark.slow  # a real child process
async def test_a_node_that_runs_another_recipe_is_refused_in_one_line(tmp_path: Path, head_engine: HeadEngine) -> None:
    node = cluster_node(HEAD)
    assert node is not None
    said: list[str] = []
    watch = NodeWatch(node, FINGERPRINT, head_engine, tmp_path, said.append, ranks_per_node=1)
    other = FINGERPRINT | {"VL_MODEL": "qwen\x1b[2J"}
    for _ in range(3):
        status, answer = watch.heard({"rank": 1, "fingerprint": other, "engine": None})
        assert status == 409 and "VL_MODEL='qwen' where rank 0 has 'tiny'" in answer["refused"]
    assert said == [
        "cluster: node 1 refused: it runs VL_MODEL='qwen' where rank 0 has 'tiny'; every node must run the same "
        "image and recipe with the same NUM_NODES"
    ]
    assert watch.heard({"rank": 7, "fingerprint": FINGERPRINT})[0] == 400


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("node0:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB ens1:10.65.0.2<0>", "NET/IB (RDMA"),
        ("node0:1:1 [0] NCCL INFO NET/Socket : Using [0]ens1:10.65.0.2<0>", "NET/Socket (plain TCP"),
    ],
)
def test_the_boot_log_says_which_transport_nccl_took(tmp_path: Path, line: str, said: str) -> None:
    told: list[str] = []
    note = TransportNote(tmp_path, told.append)
    note.check(serving=False)  # nothing yet: it looks again
    (tmp_path / "engine.log").write_text(f"INFO starting\n{line}\nINFO more\n")
    note.check(serving=False)
    note.check(serving=True)
    assert len(told) == 1 and told[0].startswith(f"cluster: NCCL joins the nodes over {said}")


def test_a_log_without_nccl_stops_being_read_once_the_engine_serves(tmp_path: Path) -> None:
    told: list[str] = []
    note = TransportNote(tmp_path, told.append)
    (tmp_path / "engine.log").write_text("INFO gloo: the CPU's backend\n")
    note.check(serving=True)
    (tmp_path / "engine.log").write_text("NCCL INFO NET/Socket : Using [0]eth0\n")
    note.check(serving=True)
    assert told == []


@pytest.mark.anyio
@pytest.mark.slow  # real child processes and the node link over HTTP
async def test_a_worker_starts_its_engine_once_rank_0_answers_and_one_that_disagrees_stops(
    tmp_path: Path, head_engine: HeadEngine
) -> None:
    port = free_port()
    head = cluster_node(HEAD | {"PRIMARY_PORT": str(port - 1)})
    worker = cluster_node(HEAD | {"PRIMARY_PORT": str(port - 1), "NODE_RANK": "1"})
    assert head is not None and worker is not None
    said: list[str] = []
    watch = asyncio.create_task(NodeWatch(head, FINGERPRINT, head_engine, tmp_path, said.append, 1).run())
    (tmp_path / "worker").mkdir()
    (tmp_path / "other").mkdir()
    engines = Supervisor(tmp_path / "worker")
    argv = [sys.executable, "-c", "import time; time.sleep(600)"]
    refusals: list[str] = []
    link = asyncio.create_task(
        NodeLink(worker, FINGERPRINT, engines, lambda: ChildSpec(ENGINE, argv), refusals.append).run()
    )
    other = NodeLink(
        worker,
        FINGERPRINT | {"NUM_NODES": "3"},
        Supervisor(tmp_path / "other"),
        lambda: ChildSpec(ENGINE, argv),
        refusals.append,
    )
    try:
        await eventually(lambda: engines.pid(ENGINE) is not None)  # started once rank 0 answered
        await eventually(lambda: read_engine_health(tmp_path) == {"engine": "healthy", "node 1": "healthy"})
        await asyncio.wait_for(other.run(), 30)  # refused: it returns, and says why
        assert refusals == ["cluster: rank 0 refuses this node: it runs NUM_NODES='3' where rank 0 has '2'"]
        assert said[-1].startswith("cluster: node 1 refused: it runs NUM_NODES='3'")
    finally:
        link.cancel()
        watch.cancel()
        await asyncio.gather(link, watch, return_exceptions=True)
        await engines.stop()


@pytest.mark.anyio
async def test_a_node_link_that_cannot_listen_says_so_in_one_line(tmp_path: Path, head_engine: HeadEngine) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        head = cluster_node(HEAD | {"PRIMARY_PORT": str(port - 1)})
        assert head is not None
        said: list[str] = []
        await NodeWatch(head, FINGERPRINT, head_engine, tmp_path, said.append, 1).run()
    assert len(said) == 1 and said[0].startswith(f"cluster: rank 0's node link cannot listen on 127.0.0.1:{port} (")
