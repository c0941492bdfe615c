"""A node of a RunPod Instant Cluster: its place (RunPod's variables, each checked in one line like a VL_* setting),
how the model is spread over the nodes (VL_CLUSTER), and the vLLM options and environment each node's engine gets.

vLLM's own multi-node engine, no Ray: with data parallelism every node holds replicas, rank 0 runs the API server
and the others `--headless` engines that join it (`--data-parallel-start-rank`); with pipeline parallelism the
layers are split across the nodes (`--nnodes --node-rank --master-addr`), tensor parallel inside each.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from runtime.settings import Settings, SettingsError, integer

MAX_NODES = 64  # an Instant Cluster's largest
SIOCGIFADDR = 0x8915  # Linux's ioctl for an interface's IPv4 address
# The node link (runtime.pod.nodelink) listens beside vLLM's port: PRIMARY_PORT is vLLM's (RunPod: all ports free).
LINK_PORT_OFFSET = 1
NODES = integer(2, MAX_NODES)
PORT = integer(1024, 65534)  # the port and the one after it (the node link)
GPUS = integer(1, 16)
T = TypeVar("T")


@dataclass(frozen=True)
class ClusterNode:
    """This node's place in its cluster, as RunPod sets it on every node: how many, which one, where the head is."""

    nodes: int  # NUM_NODES
    rank: int  # NODE_RANK: 0 is the head (the API server, the bridge), the others run headless engines
    primary_addr: str  # PRIMARY_ADDR: the head's address on the cluster network
    primary_port: int  # PRIMARY_PORT: vLLM's rendezvous (DP RPC or torch's master port)
    node_addr: str  # NODE_ADDR: this node's static address on the cluster network
    gpus: int  # NUM_TRAINERS: GPUs per node

    @property
    def head(self) -> bool:
        return self.rank == 0

    @property
    def link_port(self) -> int:
        """The head's node link: each worker's heartbeat, the head's answer (runtime.pod.nodelink)."""
        return self.primary_port + LINK_PORT_OFFSET

    def describe(self) -> str:
        role = "the head: API server, bridge" if self.head else "a worker: headless engine"
        return f"cluster node {self.rank} of {self.nodes} ({role}), {self.node_addr}, head {self.primary_addr}"


def cluster_node(environ: Mapping[str, str]) -> ClusterNode | None:
    """This node's place when RunPod made it a cluster's (NUM_NODES set), else None; SettingsError names the first
    variable that is missing or wrong."""
    if not environ.get("NUM_NODES", "").strip():
        return None
    nodes = _read(environ, "NUM_NODES", NODES.parse, NODES.allowed)
    ranks = integer(0, nodes - 1)
    rank = _read(environ, "NODE_RANK", ranks.parse, f"{ranks.allowed} (NUM_NODES={nodes})")
    primary = _read(environ, "PRIMARY_ADDR", ipv4, "the head's IPv4 address on the cluster network")
    port = _read(environ, "PRIMARY_PORT", PORT.parse, f"{PORT.allowed}: vLLM's port, the node link on the next")
    node = _read(environ, "NODE_ADDR", ipv4, "this node's IPv4 address on the cluster network")
    gpus = _read(environ, "NUM_TRAINERS", GPUS.parse, GPUS.allowed, default="1")
    if rank == 0 and node != primary:
        raise SettingsError("NODE_ADDR", node, f"PRIMARY_ADDR ({primary}) on rank 0, the head")
    return ClusterNode(nodes, rank, primary, port, node, gpus)


def _read(
    environ: Mapping[str, str], name: str, parse: Callable[[str], T], allowed: str, default: str | None = None
) -> T:
    raw = environ.get(name, default)
    if raw is None:
        raise SettingsError(name, "", f"{allowed} (RunPod sets it on every node of an Instant Cluster)")
    try:
        return parse(raw)
    except ValueError:
        raise SettingsError(name, raw, allowed) from None


def ipv4(raw: str) -> str:
    return str(ipaddress.IPv4Address(raw.strip()))


def check_cluster(settings: Settings, node: ClusterNode, mode: str) -> None:
    """What a cluster cannot take, each refused in one line: a pipeline of data-parallel engines, several engines
    behind a router on a node, vLLM without the bridge, a model swap, ports that collide."""
    if mode == "pp" and settings.dp > 1:
        raise SettingsError("VL_DP", str(settings.dp), "1 with VL_CLUSTER=pp (the nodes hold one pipeline)")
    if settings.replicas not in (None, 1):
        raise SettingsError("VL_REPLICAS", str(settings.replicas), "1 or auto on a cluster's node (one engine a node)")
    if not settings.bridge:
        raise SettingsError("VL_BRIDGE", "off", "on on a cluster (the bridge pins each agent to its replica)")
    if settings.swap:
        raise SettingsError("VL_SWAP", ",".join(settings.swap), "empty on a cluster (a swap would restart one node)")
    check_ports(node, settings)


def check_ports(node: ClusterNode, settings: Settings) -> None:
    """vLLM's port and the node link's must be free of every port the pod serves on."""
    taken = {
        "VL_PORT": settings.port,
        "VL_ENGINE_PORT": settings.engine_port,
        "VL_ROUTER_PORT": settings.router_port,
        "VL_SSH_PORT": settings.ssh_port,
    }
    for name, port in taken.items():
        if port in (node.primary_port, node.link_port):
            raise SettingsError(
                "PRIMARY_PORT", str(node.primary_port), f"a port whose next one is free of {name} ({port})"
            )


def interface_of(address: str) -> str:
    """The name of the interface that holds `address` (RunPod: `ens1`, never `eth0`'s management network), for NCCL
    and Gloo, which otherwise pick the first interface that is up."""
    found = []
    for _, name in socket.if_nameindex():
        held = interface_address(name)
        if held == address:
            return name
        found.append(f"{name}={held or 'none'}")
    raise SettingsError("NODE_ADDR", address, f"an address of one of this node's interfaces ({', '.join(found)})")


def interface_address(name: str) -> str | None:
    """The IPv4 address of interface `name`, or None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(answer[20:24])


def spread(settings: Settings, node: ClusterNode, recipe_gpus: int) -> str:
    """VL_CLUSTER resolved: `dp` (a replica per node) when the recipe's engine fits one node's GPUs, else `pp`."""
    if settings.cluster != "auto":
        return settings.cluster
    return "dp" if recipe_gpus <= node.gpus else "pp"


def engine_options(node: ClusterNode, mode: str, dp_local: int, tp: int) -> dict[str, object]:
    """vLLM's options for this node's engine: its share of the data-parallel ranks, or its pipeline stage."""
    if mode == "dp":
        options: dict[str, object] = {
            "data-parallel-size": node.nodes * dp_local,
            "data-parallel-size-local": dp_local,
            "data-parallel-address": node.primary_addr,
            "data-parallel-rpc-port": node.primary_port,
        }
        if not node.head:
            options |= {"headless": True, "data-parallel-start-rank": node.rank * dp_local}
        return options
    options = {
        "tensor-parallel-size": tp,
        "pipeline-parallel-size": node.nodes,
        "nnodes": node.nodes,
        "node-rank": node.rank,
        "master-addr": node.primary_addr,
        "master-port": node.primary_port,
    }
    return options | ({} if node.head else {"headless": True})


def engine_env(node: ClusterNode, interface: str) -> dict[str, str]:
    """The variables that keep vLLM's, NCCL's and Gloo's traffic on the cluster network (on `eth0` it times out)."""
    return {
        "VLLM_HOST_IP": node.node_addr,
        "NCCL_SOCKET_IFNAME": interface,
        "GLOO_SOCKET_IFNAME": interface,
        "NCCL_DEBUG": "INFO",  # the engine's log then says whether NCCL took NET/IB (RDMA) or NET/Socket (TCP)
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
    }


def replicas_per_node(settings: Settings, node: ClusterNode, tp: int) -> int:
    """A node's data-parallel replicas: VL_DP when set, else as many as its GPUs hold at the engine's tensor parallel
    (what `runtime plan` sizes: nemotron on 2 nodes of 8 H100s, TP 1 x DP 16)."""
    if settings.sources.get("dp", "default") != "default":
        return settings.dp
    return max(1, node.gpus // tp)
