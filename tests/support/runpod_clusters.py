"""The RunPod stand-in's Instant Clusters: `GET/POST /v2/clusters`, `GET/PATCH/DELETE /v2/clusters/{id}`,
`GET /v2/clusters/{id}/pods`, each body and answer checked against the vendored OpenAPI as the stand-in's other routes
(runpod_server.py's RunPodServer serves this app: its own routes and these).

A cluster's members are pods of the account with a `cluster` block (rank, address on the cluster's network): left out
of `GET /v2/pods` unless `includeClusterPods=true`, readable at `GET /v2/pods/{id}`, never stopped, started or deleted
through the pod routes (400: "manage them through /v2/clusters/{id}", the spec's words); each moves PROVISIONING →
STARTING → RUNNING one step per read, as a pod does. RunPod's variables for each node (its instant-clusters
configuration page) are kept in the state's `node_variables`, which the machines add to the node's environment at start as RunPod
does (they are not in the Pod's `env`): NUM_NODES, NODE_RANK, NODE_ADDR (the node's static address on the cluster's
network), PRIMARY_ADDR/MASTER_ADDR (rank 0's), PRIMARY_PORT/MASTER_PORT, HOST_NODE_ADDR (`addr:port`), NUM_TRAINERS
(GPUs a node), WORLD_SIZE (all GPUs). PRIMARY_PORT's value is not documented ("all ports are available"): 29500 here,
torch's usual rendezvous port. A cluster takes public images only: the schema has no `registry`, so a body with one is
a 422. A GPU type in `out_of_stock` is RunPod's capacity refusal (400), as for a pod. TRAINING and APPLICATION members
have no role; SLURM and RAY ones are given the spec's roles.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from tests.support.runpod_server import (
    DEFAULT_CUDA,
    NEXT_STATUS,
    NO_CAPACITY,
    Problem,
    RunPodApp,
    new_pod,
    now,
)

NETWORK = ipaddress.ip_network("10.65.0.0/16")  # the spec's example overlay network
PRIMARY_PORT = 29500
ROLES = {"RAY": ("RAY_HEAD", "RAY_WORKER"), "SLURM": ("SLURM_CONTROLLER", "SLURM_COMPUTE")}
MEMBERS_ONLY = "Pods that belong to a Cluster cannot be {} here: manage them through /v2/clusters/{}."


class ClusterApp(RunPodApp):
    """The stand-in's app with the cluster routes; the pod routes as RunPod treats a cluster's members."""

    def asgi(self) -> Starlette:
        app = super().asgi()
        app.router.routes[0:0] = [
            Route("/v2/clusters", self.operation(self.list_clusters), methods=["GET"]),
            Route("/v2/clusters", self.operation(self.create_cluster, "CreateClusterRequest"), methods=["POST"]),
            Route("/v2/clusters/{id}", self.operation(self.get_cluster), methods=["GET"]),
            Route("/v2/clusters/{id}", self.operation(self.rename_cluster, "UpdateClusterRequest"), methods=["PATCH"]),
            Route("/v2/clusters/{id}", self.operation(self.delete_cluster), methods=["DELETE"]),
            Route("/v2/clusters/{id}/pods", self.operation(self.list_cluster_pods), methods=["GET"]),
        ]
        return app

    def list_clusters(self, request: Request, body: None) -> tuple[int, str, Any]:
        return 200, "ListClustersResponse", {"clusters": [self.shown(c) for c in self.state.clusters.values()]}

    def get_cluster(self, request: Request, body: None) -> tuple[int, str, Any]:
        return 200, "Cluster", self.shown(self.cluster(request))

    def rename_cluster(self, request: Request, body: dict[str, Any]) -> tuple[int, str, Any]:
        cluster = self.cluster(request)
        cluster["name"] = body.get("name", cluster["name"])
        return 200, "Cluster", self.shown(cluster)

    def create_cluster(self, request: Request, body: dict[str, Any]) -> tuple[int, str, Any]:
        if "image" not in body:
            raise Problem(400, "image is required")
        compute = body["compute"]
        if compute["gpuTypeId"] in self.state.out_of_stock:
            raise Problem(400, NO_CAPACITY)
        for volume in (body.get("mounts") or {}).get("network", []):
            if volume["volumeId"] not in self.state.volumes:
                raise Problem(400, f"network volume {volume['volumeId']} not found")
        cluster_id = self.state.new_id()
        centre = (body.get("dataCenterIds") or ["US-TX-3"])[0]
        cluster = {
            "id": cluster_id, "name": body["name"], "type": body["type"], "compute": dict(compute),
            "dataCenterId": centre, "createdAt": now(), "members": [],
            "network": {"cidr": str(NETWORK), "vxlanId": 42, "vxlanPort": 4789},
        }  # fmt: skip
        self.state.clusters[cluster_id] = cluster
        addresses = [str(NETWORK.network_address + 2 + rank) for rank in range(compute["podCount"])]
        for rank, address in enumerate(addresses):
            pod_id = self.state.new_id()
            pod_body: dict[str, Any] = {
                "name": f"{body['name']}-node-{rank}",
                "gpu": {"id": compute["gpuTypeId"], "count": compute["gpuCountPerPod"]},
                "dataCenterIds": [centre],
                **{k: body[k] for k in ("image", "args", "disk", "ports", "env", "mounts") if k in body},
            }
            pod = new_pod(pod_id, pod_body, None, DEFAULT_CUDA)
            pod["cluster"] = {"id": cluster_id, "rank": rank, "ip": address}
            if body["type"] in ROLES:
                pod["cluster"]["role"] = ROLES[body["type"]][rank > 0]
            self.state.pods[pod_id] = pod
            cluster["members"].append(pod_id)
            self.state.node_variables[pod_id] = node_variables(rank, addresses, compute["gpuCountPerPod"])
        for pod_id in cluster["members"]:
            self.state.on_pod(pod_id, "PROVISIONING")
        return 201, "Cluster", self.shown(cluster)

    def delete_cluster(self, request: Request, body: None) -> tuple[int, None, None]:
        cluster = self.cluster(request)
        for pod_id in cluster["members"]:
            self.state.pods.pop(pod_id, None)
            self.state.on_pod(pod_id, "TERMINATED")
        del self.state.clusters[cluster["id"]]
        return 204, None, None

    def list_cluster_pods(self, request: Request, body: None) -> tuple[int, str, Any]:
        members = [self.state.pods[pod_id] for pod_id in self.cluster(request)["members"]]
        for pod in members:
            if pod["status"] in NEXT_STATUS:  # provisioning moves on as it is watched
                self.moved(pod, NEXT_STATUS[pod["status"]])
        return 200, "ListPodsResponse", {"pods": members}

    # --- the pod routes, as they treat a cluster's members

    def list_pods(self, request: Request, body: None) -> tuple[int, str, Any]:
        members = request.query_params.get("includeClusterPods") == "true"
        return 200, "ListPodsResponse", {"pods": [p for p in self.state.pods.values() if members or "cluster" not in p]}

    def delete_pod(self, request: Request, body: None) -> tuple[int, str | None, Any]:
        self.refuse_member(request, "terminated")
        return super().delete_pod(request, body)

    def pod_action(self, request: Request, body: dict[str, Any]) -> tuple[int, str | None, Any]:
        self.refuse_member(request, "stopped, started or restarted")
        return super().pod_action(request, body)

    def refuse_member(self, request: Request, what: str) -> None:
        cluster = (self.state.pods.get(request.path_params["id"]) or {}).get("cluster")
        if cluster:
            raise Problem(400, MEMBERS_ONLY.format(what, cluster["id"]))

    def cluster(self, request: Request) -> dict[str, Any]:
        cluster = self.state.clusters.get(request.path_params["id"])
        if cluster is None:
            raise Problem(404, "cluster not found")
        return cluster

    def shown(self, cluster: dict[str, Any]) -> dict[str, Any]:
        """A Cluster as the API answers it: its members counted by status, rank 0 as its primary."""
        members = [self.state.pods[pod_id] for pod_id in cluster["members"] if pod_id in self.state.pods]
        by_status: dict[str, int] = {}
        for pod in members:
            by_status[pod["status"]] = by_status.get(pod["status"], 0) + 1
        shown = {k: v for k, v in cluster.items() if k != "members"}
        shown["pods"] = {"total": len(members), "byStatus": by_status}
        if members:
            shown["primary"] = {"podId": members[0]["id"], "status": members[0]["status"]}
        return json.loads(json.dumps(shown))


def node_variables(rank: int, addresses: list[str], gpus_per_node: int) -> dict[str, str]:
    """What RunPod sets on node `rank` of a cluster whose nodes have `addresses` (rank 0 the primary)."""
    primary = addresses[0]
    return {
        "NUM_NODES": str(len(addresses)), "NODE_RANK": str(rank), "NODE_ADDR": addresses[rank],
        "PRIMARY_ADDR": primary, "MASTER_ADDR": primary, "PRIMARY_PORT": str(PRIMARY_PORT),
        "MASTER_PORT": str(PRIMARY_PORT), "HOST_NODE_ADDR": f"{primary}:{PRIMARY_PORT}",
        "NUM_TRAINERS": str(gpus_per_node), "WORLD_SIZE": str(gpus_per_node * len(addresses)),
    }  # fmt: skip
