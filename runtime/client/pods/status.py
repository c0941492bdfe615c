"""`pod status`: one line per pod of ours (or the one named): its machine, state, cost, uptime, URL, and whether it
serves; a cluster of ours is one block: its line (its shape, its nodes' state, their cost, rank 0's URL and whether it
serves), then a line per node under it."""

from __future__ import annotations

from runtime.client.columns import print_columns
from runtime.client.pods import cluster
from runtime.client.pods.boot import health
from runtime.client.pods.facade import Pods, machine
from runtime.health import health_answer, serves_model
from runtime.runpod.payloads import Cluster, Pod
from runtime.runpod.proxy import proxy_url

Row = tuple[str, str, str, str, str, str, str]


def status(pods: Pods, pod_id: str | None) -> int:
    clusters = [c for c in pods.api.clusters() if c["id"] == pod_id or not pod_id]
    blocks = [(c, cluster.ranked(pods.api.cluster_pods(c["id"]))) for c in clusters]
    blocks = [(c, nodes) for c, nodes in blocks if pod_id or any(is_ours(node) for node in nodes)]
    chosen = [] if blocks and pod_id else [pods.get(pod_id)] if pod_id else [p for p in pods.all() if is_ours(p)]
    if not chosen and not blocks:
        print("no pod of ours (python -m runtime pod up --template ... makes one)")
        return 0
    rows: list[Row] = [("id", "machine", "state", "$/h", "uptime", "URL", "serves")]
    rows += [pod_row(pod, pod["id"], machine(pod)) for pod in chosen]
    for each, nodes in blocks:
        rows.append(cluster_row(each, nodes))
        rows += [
            pod_row(node, f"  {node['id']}", f"{cluster.rank_of(node)}: {machine(node)}", url=False) for node in nodes
        ]
    print_columns(rows)
    return 0


def pod_row(pod: Pod, shown_id: str, on: str, url: bool = True) -> Row:
    """A pod's line: its machine, state, cost, uptime; its URL and whether it serves (not a cluster's node's)."""
    uptime = (pod.get("runtime") or {}).get("uptime")
    at = proxy_url(pod["id"])
    return (
        shown_id,
        on,
        pod["status"],
        f"{pod['cost']:.2f}",
        duration(uptime) if uptime is not None else "-",
        at if url else "-",
        serving(at, pod["status"]) if url else "-",
    )


def cluster_row(each: Cluster, nodes: list[Pod]) -> Row:
    """A cluster's line: its shape, its nodes' state, their cost, rank 0's uptime, URL and whether it serves."""
    primary = nodes[0] if nodes and cluster.rank(nodes[0]) == 0 else None
    uptime = (primary.get("runtime") or {}).get("uptime") if primary else None
    at = proxy_url(primary["id"]) if primary else "-"
    return (
        each["id"],
        f"cluster: {cluster.shape(each)}",
        cluster.summary(nodes),
        f"{sum(node['cost'] for node in nodes):.2f}",
        duration(uptime) if uptime is not None else "-",
        at,
        serving(at, "RUNNING" if nodes and all(n["status"] == "RUNNING" for n in nodes) else "-") if primary else "-",
    )


def serving(url: str, status: str) -> str:
    """`status`'s column: yes, no, stopped (its engine left stopped), or - when the pod is not running."""
    if status != "RUNNING":
        return "-"
    answer = health(url)  # no key needed: the one word
    if answer is None:
        return "no"
    return (
        "stopped" if health_answer(answer[1]).get("status") == "stopped" else "yes" if serves_model(*answer) else "no"
    )


def is_ours(pod: Pod) -> bool:
    """A pod of this project: its environment holds our settings (a template of build.py's sets VL_MODEL)."""
    return any(name.startswith("VL_") for name in pod.get("env") or {})


def duration(seconds: int) -> str:
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours}h{minutes:02d}" if hours else f"{minutes}m"
