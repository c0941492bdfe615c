"""`python -m runtime pod up|watch|status|stop|start|replace|down|gpus`: the user's pods on RunPod, from the template
build.py saved to a pod that serves Claude Code, without RunPod's console.

`up` creates the pod from the template on a GPU type an image of ours serves and its model fits (`runtime plan`'s
verdict: the user's types in their order, else the catalogue's cheapest first), each tried in the data centres with
stock before the next type on a capacity refusal, then watches it boot: the pod's Hub log as it comes, then its `/health`
through RunPod's proxy until the model is served, and ends with what `runtime connect` prints. With
`--workers N`, N such pods and a gateway in front of them (a CPU pod: VL_ROLE=gateway), which is
what Claude Code is given. Ctrl-C
or `--timeout` stops the watching, never the pod. Every failure is one line. `RUNPOD_API_KEY` is the
key; `RUNPOD_API_URL` and `RUNPOD_PROXY_URL` (a pattern with `{pod_id}` and `{port}`) point elsewhere.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import httpx

from runtime.checks.endpoint import EndpointError, check_endpoint
from runtime.client.columns import print_columns
from runtime.client.environment import print_environment
from runtime.client.identity import pod_key, remember_pod
from runtime.headers import KEY_DEFAULT, USER_AGENT
from runtime.health import health_answer, serves_model
from runtime.liveline import LiveLine
from runtime.redact import Redactor, redacted_output
from runtime.runpod.api import CUDA_VERSIONS, KEY_VARIABLE, VOLUME_PATH, RunPodClient, RunPodError
from runtime.runpod.payloads import GpuType, NetworkVolume, Pod, PodBody, Template
from runtime.runpod.proxy import proxy_url
from runtime.sizing.cards import CARDS, DEFAULT_GPUS, card_of
from runtime.sizing.choice import Choice, choices, template_model
from runtime.units import human_seconds

POLL_S = 5.0
LOG_LINE_CHARS = 300
HEALTH_TIMEOUT_S = 10.0
HOST_TAKEN = "not enough free GPUs"  # RunPod's words when a stopped pod's host has been rented again
GONE = ("EXITED", "ERROR", "TERMINATED")
GATEWAY_CPU = "cpu3c"  # compute-optimised: the gateway only relays (the bridge and the router, no engine)
GATEWAY_VCPUS = 2  # RunPod's smallest CPU pod; its RAM is the flavour's share per vCPU


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="create a pod from a template and watch it boot")
    up.add_argument("--template", required=True, help="the template's name or id (build.py --runpod prints both)")
    up.add_argument("--gpu", action="append", default=[], help="a GPU type, in order of preference; repeatable")
    volume = up.add_mutually_exclusive_group()
    volume.add_argument("--volume", metavar="NAME", help="a network volume of yours, mounted at /workspace")
    volume.add_argument("--volume-gb", type=int, metavar="GB", help="a new volume on the pod's host (>= 10 GB)")
    up.add_argument("--cloud", choices=("secure", "community"), default="secure")
    up.add_argument("--name", help="the pod's name (default: the template's target, e.g. vllm-pod-sm89)")
    up.add_argument("--max-price", type=float, metavar="DOLLARS", help="skip GPU types above DOLLARS an hour")
    up.add_argument(
        "--workers",
        type=at_least_one,
        metavar="N",
        help="N pods behind a gateway pod (a CPU pod) that keeps each conversation on one of them",
    )
    up.add_argument(
        "--gateway-cpu",
        default=GATEWAY_CPU,
        metavar="FLAVOR",
        help=f"the gateway's CPU flavour, with --workers (default {GATEWAY_CPU})",
    )
    watching(up)
    watching(actions.add_parser("watch", help="watch a pod boot until it serves")).add_argument("pod")
    watching(actions.add_parser("start", help="start a stopped pod and watch it boot")).add_argument("pod")
    actions.add_parser("gpus", help="RunPod's GPU types: memory, architecture, our image, prices, stock")
    status = actions.add_parser("status", help="one line per pod of ours: GPU, state, cost, uptime, URL, health")
    status.add_argument("pod", nargs="?")
    actions.add_parser("stop", help="stop pods (their volumes stay)").add_argument("pods", nargs="+", metavar="pod")
    down = actions.add_parser("down", help="delete pods, after saying what goes with them")
    down.add_argument("pods", nargs="+", metavar="pod")
    down.add_argument("--yes", action="store_true", help="do not ask (needed without a terminal)")
    replace = watching(
        actions.add_parser(
            "replace",
            help="recreate a pod on another host (a sick one, or one "
            "whose GPUs are taken) from its template, then delete it",
        )
    )
    replace.add_argument("pod")
    replace.add_argument(
        "--gpu", action="append", default=[], help="a GPU type (default: the pod's, then its target's)"
    )
    replace.add_argument("--yes", action="store_true", help="do not ask when a volume on its host goes with it")


def at_least_one(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of pods, at least 1")
    return int(text)


def watching(command: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of a command that watches a boot and ends with a check through the pod's bridge."""
    command.add_argument("--key", help=f"one of the pod's VL_API_KEYS (default: {KEY_DEFAULT})")
    command.add_argument("--timeout", type=float, default=30.0, metavar="MIN", help="stop watching after MIN")
    return command


HELD = (KEY_VARIABLE, "HF_TOKEN", "HF_READ_TOKEN")  # the keys a `pod` command holds, never shown whatever quotes them


@dataclass(frozen=True)
class Watching:
    """How a command that watches a boot asks the pod at the end (its key), and for how long it watches."""

    key: str | None
    timeout_min: float

    def deadline(self) -> float:
        """When the watching that starts now stops (time.monotonic's clock)."""
        return time.monotonic() + self.timeout_min * 60


@dataclass(frozen=True)
class PodRequest:
    """What `pod up` is asked for: the template, the GPUs in order, the volume, the cloud, the pod's name, and with
    `workers` a team of that many pods behind a gateway on `gateway_cpu`."""

    template: str
    gpus: Sequence[str] = ()
    volume: str | None = None
    volume_gb: int | None = None
    cloud: str = "secure"
    name: str | None = None
    workers: int | None = None
    gateway_cpu: str = GATEWAY_CPU
    max_price: float | None = None


def run(args: argparse.Namespace) -> int:
    redactor = Redactor(os.environ.get(name, "") for name in HELD)
    with redacted_output(redactor):
        if args.action == "gpus" and not os.environ.get(KEY_VARIABLE, "").strip():
            return gpus(None)
        try:
            with RunPodClient(os.environ.get(KEY_VARIABLE, "")) as api:
                return dispatch(Pods(api, redactor), args)
        except (RunPodError, EndpointError) as error:
            print(f"pod: {error}", file=sys.stderr)
            return 1


def dispatch(pods: Pods, args: argparse.Namespace) -> int:
    """The command line mapped onto the typed calls below: argparse's Namespace goes no further."""
    watching = Watching(args.key, args.timeout) if "timeout" in args else Watching(None, 0)
    match args.action:
        case "up":
            request = PodRequest(
                template=args.template,
                gpus=args.gpu,
                volume=args.volume,
                volume_gb=args.volume_gb,
                cloud=args.cloud,
                name=args.name,
                workers=args.workers,
                gateway_cpu=args.gateway_cpu,
                max_price=args.max_price,
            )
            return up(pods, request, watching)
        case "watch":
            return watch(pods, args.pod, watching)
        case "start":
            return start(pods, args.pod, watching)
        case "replace":
            return replace(pods, args.pod, args.gpu, args.yes, watching)
        case "status":
            return status(pods, args.pod)
        case "gpus":
            return gpus(pods)
        case "stop":
            return stop(pods, args.pods)
        case "down":
            return down(pods, args.pods, args.yes)
    raise ValueError(f"no pod action {args.action!r}")  # argparse's choices: never


class Pods:
    """The account's pods and what they are made from, through the API; a line per step on stdout."""

    def __init__(self, api: RunPodClient, redactor: Redactor | None = None) -> None:
        self.api, self.redactor = api, redactor or Redactor()

    def hold(self, secret: str) -> None:
        """A secret made here (the team's key): never in an error line, nor in anything printed."""
        self.api.secrets += (secret,)
        self.redactor.add([secret])

    def get(self, pod_id: str) -> Pod:
        return self.api.pod(pod_id)

    def all(self) -> list[Pod]:
        return self.api.pods()

    def act(self, pod_id: str, action: str) -> None:
        self.api.act(pod_id, action)

    def template(self, name_or_id: str) -> Template:
        templates = self.api.templates()
        found = [t for t in templates if name_or_id in (t["id"], t["name"])]
        if len(found) != 1:
            names = ", ".join(repr(t["name"]) for t in templates) or "none"
            raise RunPodError(
                f"{len(found) or 'no'} template(s) named {name_or_id!r} (yours: {names}): "
                "pass one name or id (build.py --runpod saves one)"
            )
        return found[0]

    def catalogue(self) -> list[GpuType]:
        """RunPod's GPU types (memory, prices, stock by data centre); the targets' usual cards, unpriced, when
        RunPod cannot say."""
        try:
            return self.api.gpu_types()
        except RunPodError as error:
            print(f"pod: RunPod's GPU catalogue: {error}; choosing from the usual cards", file=sys.stderr)
            return [GpuType(id=gpu) for listed in DEFAULT_GPUS.values() for gpu in listed]

    def volume(self, name: str) -> NetworkVolume:
        volumes = self.api.network_volumes()
        found = [v for v in volumes if name in (v["id"], v["name"])]
        if len(found) != 1:
            names = ", ".join(repr(v["name"]) for v in volumes) or "none"
            raise RunPodError(f"{len(found) or 'no'} network volume(s) named {name!r} (yours: {names})")
        return found[0]


# --- up, watch, start ------------------------------------------------------------------------------


def up(pods: Pods, request: PodRequest, watching: Watching) -> int:
    template = pods.template(request.template)
    target = next((t for t in DEFAULT_GPUS if f" {t} " in f" {template['name']} "), None)
    if not request.gpus and not target:
        raise RunPodError(f"which GPU? pass --gpu TYPE (the template {template['name']!r} names no target)")
    model = template_model(template.get("env") or {})
    gpus = choices(pods.catalogue(), target, request.gpus, model, request.max_price, request.cloud, say=warn)
    cuda = template.get("allowedCudaVersions") or CUDA_VERSIONS
    body = PodBody(
        name=request.name or f"vllm-pod-{target or 'pod'}", templateId=template["id"], cloud=request.cloud.upper()
    )
    if request.volume:
        volume = pods.volume(request.volume)  # a network volume lives in one data centre: the pod must too
        body["mounts"] = {"network": [{"volumeId": volume["id"], "path": VOLUME_PATH}]}
        body["dataCenterIds"] = [volume["dataCenter"]]
    elif request.volume_gb:
        body["mounts"] = {"persistent": {"size": request.volume_gb, "path": VOLUME_PATH}}
    env = template.get("env") or {}
    if request.workers:
        return up_team(pods, request, watching, body, gpus, cuda, env)
    pod = place(pods, body, gpus, cuda)
    return watch_boot(pods, pod["id"], watching, env)


def up_team(
    pods: Pods,
    request: PodRequest,
    watching: Watching,
    body: PodBody,
    gpus: list[Choice],
    cuda: list[str],
    env: Mapping[str, str],
) -> int:
    """N pods from the template, then a gateway in front of them (a CPU pod: no GPU to pay for), a key
    of the team's own between them; watched until the gateway serves, which is what Claude Code is given."""
    key = secrets.token_urlsafe(32)  # in the team's pods' environment at RunPod, printed nowhere
    pods.hold(key)
    workers: list[Pod] = []
    try:
        for index in range(request.workers or 0):
            worker = body.copy()
            worker["name"], worker["env"] = f"{body['name']}-worker-{index}", {"VL_WORKER_KEY": key}
            workers.append(place(pods, worker, gpus, cuda))
    except RunPodError as error:
        raise RunPodError(f"{error}{still_running(workers)}") from None
    team_cost = sum(worker["cost"] for worker in workers)
    gateway_body = PodBody(
        {
            "name": f"{body['name']}-gateway",
            "templateId": body["templateId"],
            "cloud": body["cloud"],
            "cpu": {"id": request.gateway_cpu, "vcpuCount": GATEWAY_VCPUS},  # no volume: a gateway keeps no weights
            "env": {
                "VL_ROLE": "gateway",
                "VL_WORKERS": ",".join(proxy_url(worker["id"]) for worker in workers),
                "VL_WORKER_KEY": key,
                "VL_COST_PER_HOUR": f"{team_cost:g}",
            },  # the console counts the team's GPUs
        }
    )
    try:
        gateway = pods.api.create_pod(gateway_body, f"the gateway on {request.gateway_cpu}")
    except RunPodError as error:
        raise RunPodError(f"{error} (try --gateway-cpu another flavour){still_running(workers)}") from None
    print(
        f"gateway {gateway['id']} ({gateway['name']}): {request.gateway_cpu}, ${gateway['cost']:.2f}/h, "
        f"{gateway['status']}, in front of {', '.join(worker['id'] for worker in workers)}",
        flush=True,
    )
    deadline = watching.deadline()
    for pod in [*workers, gateway]:
        status = boot(pods, pod["id"], env, deadline)
        if status:
            return status
    url = proxy_url(gateway["id"])
    gateway_key = pod_key(watching.key, url)
    print_environment(check_endpoint(url, gateway_key or "x"))
    remember_pod(url, gateway_key)  # the client commands without a URL: this team's gateway
    every = " ".join(pod["id"] for pod in [gateway, *workers])
    print(f"\n# the team: python -m runtime pod status; pod stop {every}; pod down {every}")
    return 0


def still_running(pods: list[Pod]) -> str:
    """What a failed team leaves behind, and how to remove it."""
    if not pods:
        return ""
    ids = " ".join(pod["id"] for pod in pods)
    return f"; created already, and billing: {ids} (python -m runtime pod down {ids} --yes)"


def place(pods: Pods, body: PodBody, gpus: list[Choice], cuda: list[str]) -> Pod:
    """The pod created on the first GPU type RunPod can place it on, in the first of its data centres that takes
    it (a volume's data centre only, when a network volume pins it), said in a line; else one line listing what
    was tried."""
    tried = []
    for choice in gpus:
        gpu, pod = choice.gpu, None
        wheres = [[]] if "dataCenterIds" in body or not choice.centres else [[c] for c in choice.centres]
        for index, where in enumerate(wheres):
            on = body.copy()
            on["gpu"] = {"id": gpu, "count": 1, "allowedCudaVersions": cuda}
            if where:
                on["dataCenterIds"] = where
            try:
                pod = pods.api.create_pod(on, f"a pod on {gpu}")
                break
            except RunPodError as error:
                if error.status not in (400, 403):  # 400: no capacity (or a rule), 403: not this pool; else stop
                    raise
                reason = error.detail or error.status
                if index + 1 < len(wheres):  # the next data centre first (the notes: dataCenterIds usually does)
                    print(
                        f"pod: {gpu} in {where[0]}: refused ({reason}); trying {wheres[index + 1][0]}", file=sys.stderr
                    )
                    continue
                tried.append(f"{gpu} ({reason})")
                print(f"pod: {gpu}: refused ({reason}); trying the next", file=sys.stderr)
        if pod is None:
            continue
        print(f"pod {pod['id']} ({pod['name']}): {gpu}, ${pod['cost']:.2f}/h, {pod['status']}", flush=True)
        host = pod.get("cudaVersion")
        if host and host.split(".")[0] != cuda[0].split(".")[0]:
            print(
                f"pod: warning: its host reports CUDA {host}, the image needs {', '.join(cuda)}: it will say so "
                f"and stop (python -m runtime pod down {pod['id']})",
                file=sys.stderr,
            )
        return pod
    raise RunPodError(
        f"no pod could be placed, tried: {'; '.join(tried)}: try other --gpu types, --cloud community, or later"
    )


def watch(pods: Pods, pod_id: str, watching: Watching) -> int:
    return watch_boot(pods, pod_id, watching, pods.get(pod_id).get("env") or {})


def start(pods: Pods, pod_id: str, watching: Watching) -> int:
    pod = pods.get(pod_id)
    try:
        pods.act(pod_id, "start")
    except RunPodError as error:
        if HOST_TAKEN not in error.detail:
            raise
        raise RunPodError(f"{pod_id} cannot start: {restart_advice(pod)}") from None
    return watch_boot(pods, pod_id, watching, pod.get("env") or {})


def restart_advice(pod: Pod) -> str:
    """What to do with a stopped pod whose host's GPUs are rented again."""
    if (pod.get("mounts") or {}).get("network"):
        return (
            f"its host's GPUs are rented to someone else; its network volume keeps the weights: "
            f"python -m runtime pod replace {pod['id']}"
        )
    return (
        f"its host's GPUs are rented to someone else, and its volume lives on that host: try again later, or "
        f"python -m runtime pod replace {pod['id']} --yes (the weights download again)"
    )


def replace(pods: Pods, pod_id: str, gpus_asked: Sequence[str], yes: bool, watching: Watching) -> int:
    """The pod made again from its template on the first host RunPod places it on (its network volume kept), the
    old one deleted once the new one exists, then watched as `up` watches: a sick host's way out."""
    old = pods.get(pod_id)
    made_from, gpu = old.get("template"), old.get("gpu")
    if not gpu or not made_from:
        raise RunPodError(f"{pod_id} is no GPU pod made from a template (a team's gateway: pod up --workers again)")
    template = pods.template(made_from)
    mounts = old.get("mounts") or {}
    body = PodBody(
        name=old["name"],
        templateId=template["id"],
        cloud=old.get("cloud", ""),
        env={k: v for k, v in (old.get("env") or {}).items() if (template.get("env") or {}).get(k) != v},
    )
    if network := mounts.get("network"):
        body["mounts"] = {"network": network}
        body["dataCenterIds"] = [old.get("dataCenterId") or ""]
    else:
        if mounts.get("persistent"):
            body["mounts"] = {"persistent": mounts["persistent"]}  # a new one, empty, on the new host
        confirm(f"replacing {going(old)}; a new volume starts empty (the weights download again)", yes)
    target = next((t for t in DEFAULT_GPUS if f"-{t}" in old["name"] or f" {t} " in f" {template['name']} "), "")
    asked = list(dict.fromkeys(gpus_asked or [gpu["id"], *DEFAULT_GPUS.get(target, [])]))
    gpus = choices(pods.catalogue(), target or None, asked, None, None, body["cloud"].lower(), say=warn)
    new = place(pods, body, gpus, template.get("allowedCudaVersions") or CUDA_VERSIONS)
    pods.api.delete_pod(pod_id)
    print(f"deleted {going(old)}: replaced by {new['id']}", flush=True)
    return watch_boot(pods, new["id"], watching, old.get("env") or {})


def warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def gpus(pods: Pods | None) -> int:
    """RunPod's GPU types, as `pod up` sees them (the notes' `pod.py stock`); without a key (None), the built-in
    table `plan` sizes without one, unpriced, since a first look at the cards needs no account."""
    if pods is None:
        print(f"(the built-in table of common cards: prices and stock need {KEY_VARIABLE})")
    # The table's cards as catalogue entries: card_of finds each by its id; "memory" only orders them.
    catalogue = pods.api.gpu_types() if pods else [GpuType(id=card.id, memory=card.memory_gib) for card in CARDS]
    rows = [("id", "GiB", "arch", "image", "secure $/h", "community $/h", "stock")]
    for entry in sorted(catalogue, key=lambda e: (e.get("memory") or 0, str(e["id"]))):
        card = card_of(str(entry["id"]), float(entry.get("memory") or 0), str(entry.get("name") or ""))
        price = entry.get("price") or {}
        secure, community = (f"{cost:.2f}" if (cost := price.get(c)) else "-" for c in ("secure", "community"))
        stock = str(entry.get("availability") or "-")
        rows.append((card.id, f"{card.memory_gib:.1f}", card.arch, card.image or "-", secure, community, stock))
    print_columns(rows)
    return 0


def confirm(what: str, yes: bool) -> None:
    """Asks at a terminal whether to go on with `what`; RunPodError when the answer is no, or when there is no
    terminal to ask and `--yes` was not given."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise RunPodError(f"{what}: pass --yes to confirm (no terminal to ask)")
    if input(f"{what}. Go on? [y/N] ").strip().lower() not in ("y", "yes"):
        raise RunPodError("kept: nothing was changed")


def watch_boot(pods: Pods, pod_id: str, watching: Watching, env: Mapping[str, str]) -> int:
    """Watch the pod until its bridge serves the model, print Claude Code's environment, then the pod's self-check
    verdict (VL_SELFCHECK) once it has one."""
    deadline = watching.deadline()
    status = boot(pods, pod_id, env, deadline)
    if not status:
        url, key = proxy_url(pod_id), pod_key(watching.key, proxy_url(pod_id))
        print_environment(check_endpoint(url, key or "x"))  # an open pod takes any text
        remember_pod(url, key)  # the commands without a URL
        print_verdict(pod_id, key or "x", deadline)
    return status


def print_verdict(pod_id: str, key: str, deadline: float) -> None:
    """The pod's self-check (its /health's `checked`, to a key) on the live line while it runs, then its verdict: a
    pod that serves is not yet a pod that answers right. Nothing when the pod runs none."""
    url, line, started = proxy_url(pod_id), LiveLine(), time.monotonic()
    while (verdict := self_checked(url, key)) == "running" and time.monotonic() < deadline:
        line.show(time.monotonic() - started, "self-check", "running (a line per check in its Hub log)")
        time.sleep(POLL_S)
    line.end()
    if verdict == "running":
        print(
            f"self-check: still running after {human_seconds(time.monotonic() - started)}: python -m runtime "
            f"status {url} --key ... says its verdict"
        )
    elif verdict not in (None, "off"):
        print(f"self-check: {verdict} (python -m runtime logs {pod_id}: a line per check)")


def self_checked(url: str, key: str) -> str | None:
    """`checked` of the pod's /health as a key's holder reads it; None when it cannot be read."""
    answer = health(url, key)
    return health_answer(answer[1]).get("checked") if answer is not None else None


def boot(pods: Pods, pod_id: str, env: Mapping[str, str], deadline: float) -> int:
    """Its Hub log and its state on one live line until the pod serves (0), is gone (raises), or the
    deadline passes or Ctrl-C comes: then what to type to watch again, and the exit status."""
    url, log, line = proxy_url(pod_id), boot_log(pod_id, env), LiveLine()
    started, last = time.monotonic(), ""
    try:
        while True:
            status = pods.get(pod_id)["status"]
            for text in log():
                # vLLM logs its whole config on one line: cut, as the progress line is
                line.say(f"  | {text if len(text) <= LOG_LINE_CHARS else text[:LOG_LINE_CHARS] + '...'}")
                last = text
            if status in GONE:
                raise RunPodError(
                    f"pod {pod_id} is {status}: its log above says why (python -m runtime pod "
                    f"status {pod_id}; pod start {pod_id} to try again)"
                )
            answer = health(url) if status == "RUNNING" else None
            if answer is not None and serves_model(*answer):
                break
            if answer is not None and health_answer(answer[1]).get("status") == "stopped":  # no wait will help
                line.end()
                raise RunPodError(
                    f"{pod_id}'s engine is left stopped: its log above says why (a sick host: "
                    f"python -m runtime pod replace {pod_id}; a setting: change it, then pod start)"
                )
            line.show(time.monotonic() - started, status, last)
            if time.monotonic() > deadline:
                line.end()
                print(
                    f"pod: {pod_id} is not serving after {human_seconds(time.monotonic() - started)}; it keeps "
                    f"running: python -m runtime pod watch {pod_id}",
                    file=sys.stderr,
                )
                return 1
            time.sleep(POLL_S)  # RunPod has no notification of a change: poll it
    except KeyboardInterrupt:
        line.end()
        print(f"pod: stopped watching; {pod_id} keeps running: python -m runtime pod watch {pod_id}", file=sys.stderr)
        return 130
    line.end()
    print(f"pod {pod_id} serves after {time.monotonic() - started:.0f} s", flush=True)
    return 0


def boot_log(pod_id: str, env: Mapping[str, str]) -> Callable[[], list[str]]:
    """The pod's new Hub log lines at each call (the same reader as `runtime logs --follow`), or none
    when its template names no VL_LOG_REPO or the log cannot be read yet."""
    repo_spec = env.get("VL_LOG_REPO", "")
    if not repo_spec or "{{" in repo_spec:
        return lambda: []
    from runtime.hub.logpublish import log_path
    from runtime.hub.logtail import Fatal, LogFollower, Waiting
    from runtime.hub.repo import HubRepo

    follower = LogFollower(HubRepo.parse(repo_spec, endpoint=os.environ.get("HF_ENDPOINT") or None), log_path(pod_id))
    said = ""

    def new_lines() -> list[str]:
        nonlocal said
        try:
            return follower.poll()
        except (Waiting, Fatal) as reason:  # not published yet, or not readable: the proxy's answer still decides
            if str(reason) == said:
                return []
            said = str(reason)
            return [f"(its Hub log: {reason}; still watching)"]

    return new_lines


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


def health(url: str, key: str | None = None) -> tuple[int, bytes] | None:
    """The pod's /health through RunPod's proxy (status, body), as a key's holder reads it when `key` is given; None
    while it cannot be reached."""
    headers = {"user-agent": USER_AGENT} | ({"x-api-key": key} if key else {})
    try:
        response = httpx.get(f"{url}/health", headers=headers, timeout=HEALTH_TIMEOUT_S)
    except httpx.HTTPError:
        return None
    return response.status_code, response.content


# --- status, stop, down ----------------------------------------------------------------------------


def status(pods: Pods, pod_id: str | None) -> int:
    chosen = [pods.get(pod_id)] if pod_id else [p for p in pods.all() if is_ours(p)]
    if not chosen:
        print("no pod of ours (python -m runtime pod up --template ... makes one)")
        return 0
    rows = [("id", "machine", "state", "$/h", "uptime", "URL", "serves")]
    for pod in chosen:
        url = proxy_url(pod["id"])
        uptime = (pod.get("runtime") or {}).get("uptime")
        rows.append(
            (
                pod["id"],
                machine(pod),
                pod["status"],
                f"{pod['cost']:.2f}",
                duration(uptime) if uptime is not None else "-",
                url,
                serving(url, pod["status"]),
            )
        )
    print_columns(rows)
    return 0


def is_ours(pod: Pod) -> bool:
    """A pod of this project: its environment holds our settings (a template of build.py's sets VL_MODEL)."""
    return any(name.startswith("VL_") for name in pod.get("env") or {})


def duration(seconds: int) -> str:
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours}h{minutes:02d}" if hours else f"{minutes}m"


def stop(pods: Pods, pod_ids: Sequence[str]) -> int:
    for pod_id in pod_ids:
        pods.act(pod_id, "stop")
        print(
            f"stopped {pod_id}: its GPU is released and billing stops but for its volume; the container disk "
            f"is lost (anything outside {VOLUME_PATH}), the volume keeps the weights and compile caches "
            f"(python -m runtime pod start {pod_id})"
        )
    return 0


def down(pods: Pods, pod_ids: Sequence[str], yes: bool) -> int:
    what = {pod_id: going(pods.get(pod_id)) for pod_id in pod_ids}
    confirm(f"deleting {'; '.join(what.values())}", yes)
    for pod_id, said in what.items():
        pods.api.delete_pod(pod_id)
        print(f"deleted {said}")
    return 0


def going(pod: Pod) -> str:
    """A pod, and what goes with it when it is deleted."""
    network = bool((pod.get("mounts") or {}).get("network"))
    goes = "its container disk goes; its network volume stays" if network else "its container disk and its volume go"
    return f"pod {pod['id']} ({pod['name']}, {machine(pod)}, {pod['status']}): {goes}"


def machine(pod: Pod) -> str:
    """What the pod runs on: its GPU type, or its CPU flavour."""
    if gpu := pod.get("gpu"):
        return gpu["id"]
    return f"{cpu['id']} ({cpu['vcpuCount']} vCPU)" if (cpu := pod.get("cpu")) else "-"
