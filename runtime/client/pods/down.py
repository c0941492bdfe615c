"""`pod down`: pods and clusters deleted, after saying what goes with each (asked at a terminal, else `--yes`); a
cluster goes whole (`DELETE /v2/clusters/{id}`: every node with it), never one of its nodes alone."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.client.pods import cluster
from runtime.client.pods.facade import Pods, confirm, going


def down(pods: Pods, pod_ids: Sequence[str], yes: bool) -> int:
    clusters = {c["id"]: c for c in pods.api.clusters()}
    what = {}
    for pod_id in pod_ids:
        if pod_id in clusters:
            what[pod_id] = cluster.going(clusters[pod_id], pods.api.cluster_pods(pod_id))
        elif (pod := pods.get(pod_id)).get("cluster"):
            raise cluster.not_one_by_one(pod, stopping=False)
        else:
            what[pod_id] = going(pod)
    confirm(f"deleting {'; '.join(what.values())}", yes)
    for pod_id, said in what.items():
        if pod_id in clusters:
            pods.api.delete_cluster(pod_id)
        else:
            pods.api.delete_pod(pod_id)
        print(f"deleted {said}")
    return 0
