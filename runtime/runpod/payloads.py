"""What RunPod's REST API v2 answers and is sent, as typed shapes (the schemas of its OpenAPI description: Pod,
Template, GpuType, NetworkVolume, Registry, Cluster, CreatePodRequest, CreateClusterRequest…), the fields this project
reads or writes only.

`RunPodClient` reads each answer into its shape once, where the JSON comes in; past it, no untyped dict travels.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

JsonObject = dict[str, object]  # an answer as it comes, before `RunPodClient` reads it into its shape
Stock = Literal["HIGH", "MEDIUM", "LOW", "NONE"]  # AvailabilityLevel


class PersistentMount(TypedDict):
    """A volume on the pod's host (it goes with the host)."""

    size: int  # GB, at least 10
    path: str


class NetworkMount(TypedDict):
    """A network volume of the account's, in one data centre."""

    volumeId: str
    path: str


class Mounts(TypedDict, total=False):
    """At most one of the two (the API refuses both)."""

    persistent: PersistentMount
    network: list[NetworkMount]


class GpuConfig(TypedDict):
    id: str  # the GPU type
    count: NotRequired[int]
    allowedCudaVersions: NotRequired[list[str]]  # sent with a create only


class CpuConfig(TypedDict):
    id: str  # the CPU flavour (cpu3c…)
    vcpuCount: int


class PodRuntime(TypedDict, total=False):
    uptime: int  # seconds since the container started


class PodCluster(TypedDict):
    """A member pod's place in its cluster (PodCluster): its rank (NODE_RANK; None until assigned, 0 the primary)
    and its address on the cluster's private network (NODE_ADDR), once assigned."""

    id: str  # the cluster's
    rank: int | None
    ip: NotRequired[str]


class Pod(TypedDict):
    """A pod as `GET /v2/pods/{id}` answers it."""

    id: str
    name: str
    status: str  # PodStatus: PROVISIONING, STARTING, RUNNING, EXITED, ERROR, TERMINATED…
    cost: float  # dollars an hour, as billed
    env: NotRequired[dict[str, str]]
    mounts: NotRequired[Mounts]
    gpu: NotRequired[GpuConfig]  # a GPU pod's
    cpu: NotRequired[CpuConfig]  # a CPU pod's
    cloud: NotRequired[str]  # SECURE or COMMUNITY
    dataCenterId: NotRequired[str | None]
    cudaVersion: NotRequired[str | None]  # what the host reports
    template: NotRequired[str | None]  # the template's id it was made from
    runtime: NotRequired[PodRuntime | None]
    cluster: NotRequired[PodCluster]  # a cluster's member only: managed through /v2/clusters/{id}


class PodBody(TypedDict):
    """A CreatePodRequest: a GPU pod (`gpu`) or a CPU one (`cpu`), from a template."""

    name: str
    templateId: str
    cloud: str
    gpu: NotRequired[GpuConfig]
    cpu: NotRequired[CpuConfig]
    mounts: NotRequired[Mounts]
    dataCenterIds: NotRequired[list[str]]
    env: NotRequired[dict[str, str]]


class TemplateMounts(TypedDict, total=False):
    persistent: PersistentMount


class TemplateBody(TypedDict):
    """A CreateTemplateRequest (also a valid UpdateTemplateRequest: every field is mutable)."""

    name: str
    image: str
    category: str  # NVIDIA: a GPU image
    disk: int  # the container disk, GB
    mounts: TemplateMounts
    ports: list[str]  # `8080/http`, `22/tcp`
    env: dict[str, str]
    registry: str | None  # a registry credential's id (a private image); None clears a stale one
    allowedCudaVersions: list[str]
    startSsh: bool
    startJupyter: bool
    serverless: bool
    public: bool


class Template(TypedDict):
    """A template as `GET /v2/templates` lists it."""

    id: str
    name: str
    env: NotRequired[dict[str, str]]
    allowedCudaVersions: NotRequired[list[str]]
    image: NotRequired[str]
    registry: NotRequired[str | None]  # a credential's id: a private image (which no cluster can pull)
    disk: NotRequired[int]
    ports: NotRequired[list[str]]
    mounts: NotRequired[TemplateMounts]
    startSsh: NotRequired[bool]


class ClusterCompute(TypedDict):
    """Every node alike: `podCount` pods (2 at least) of `gpuCountPerPod` GPUs of one type."""

    gpuTypeId: str
    gpuCountPerPod: int
    podCount: int


class ClusterBody(TypedDict):
    """A CreateClusterRequest (`POST /v2/clusters`): an Instant Cluster of type APPLICATION, whose nodes each run the
    image with RunPod's cluster variables (NUM_NODES, NODE_RANK, PRIMARY_ADDR…) and take their role from them (vLLM's
    own multi-node engine, no Ray: a RAY cluster would start a Ray head the images do not hold). No `registry`: a
    cluster pulls public images only."""

    name: str
    type: str  # APPLICATION
    compute: ClusterCompute
    image: str
    disk: NotRequired[int]
    mounts: NotRequired[Mounts]
    ports: NotRequired[list[str]]
    env: dict[str, str]
    startSsh: NotRequired[bool]
    dataCenterIds: NotRequired[list[str]]


class ClusterPrimary(TypedDict):
    podId: str  # rank 0's pod
    status: str


class ClusterPods(TypedDict):
    """A cluster's members counted (ClusterPodsSummary): the pods themselves are `GET /v2/clusters/{id}/pods`'."""

    total: int
    byStatus: dict[str, int]


class Cluster(TypedDict):
    """A cluster as `GET /v2/clusters/{id}` answers it."""

    id: str
    name: str
    type: str
    compute: ClusterCompute
    pods: ClusterPods
    dataCenterId: NotRequired[str]
    primary: NotRequired[ClusterPrimary]


class Price(TypedDict, total=False):
    """Dollars an hour for one GPU of a type, by cloud (None: not rented there)."""

    secure: float | None
    community: float | None


class DataCenterStock(TypedDict):
    id: str
    availability: Stock


class GpuType(TypedDict):
    """An entry of `GET /v2/catalog/gpus` (GpuType): the built-in table's cards carry the id and memory only."""

    id: str
    name: NotRequired[str]
    memory: NotRequired[float]  # GB, as RunPod says it
    price: NotRequired[Price]
    availability: NotRequired[Stock]
    dataCenters: NotRequired[list[DataCenterStock]]


class NetworkVolume(TypedDict):
    id: str
    name: str
    dataCenter: str


class Registry(TypedDict):
    """A container registry credential (its password is write-only)."""

    id: str
    name: str
