"""`python -m runtime pod up|watch|status|stop|start|replace|down|gpus`: the user's pods on RunPod, from the template
build.py saved to a pod that serves Claude Code, without RunPod's console; one module per verb, as pipx's commands.

`up` creates the pod from the template on a GPU type an image of ours serves and its model fits (`runtime plan`'s
verdict: the user's types in their order, else the catalogue's cheapest first), each tried in the data centres with
stock before the next type on a capacity refusal, then watches it boot: the pod's Hub log as it comes, then its `/health`
through RunPod's proxy until the model is served, and ends with what `runtime connect` prints. With
`--workers N`, N such pods and a gateway in front of them (a CPU pod: VL_ROLE=gateway), which is
what Claude Code is given. With `--nodes N`, a RunPod Instant Cluster of N nodes (`cluster`: type APPLICATION, each
node in its role from RunPod's variables, every node's boot watched, rank 0's endpoint checked); `status`, `watch` and
`down` take a cluster's id as a pod's, and say a cluster as one block (RunPod stops no cluster). Ctrl-C
or `--timeout` stops the watching, never the pod. Every failure is one line. `RUNPOD_API_KEY` is the
key; `RUNPOD_API_URL` and `RUNPOD_PROXY_URL` (a pattern with `{pod_id}` and `{port}`) point elsewhere.
"""

from __future__ import annotations

import argparse
import os
import sys

from runtime.checks.endpoint import EndpointError
from runtime.client.pods.boot import Watching
from runtime.client.pods.down import down
from runtime.client.pods.facade import Pods
from runtime.client.pods.gpus import gpus
from runtime.client.pods.power import start, stop
from runtime.client.pods.replace import replace
from runtime.client.pods.status import status
from runtime.client.pods.up import GATEWAY_CPU, PodRequest, up
from runtime.client.pods.watch import watch
from runtime.headers import KEY_DEFAULT
from runtime.redact import Redactor, redacted_output
from runtime.runpod.api import KEY_VARIABLE, RunPodClient, RunPodError
from runtime.runpod.clusters import MIN_NODES
from runtime.sizing.nodes import GPUS_PER_NODE


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up_command = actions.add_parser("up", help="create a pod from a template and watch it boot")
    up_command.add_argument(
        "--template", required=True, help="the template's name or id (build.py --runpod prints both)"
    )
    up_command.add_argument("--gpu", action="append", default=[], help="a GPU type, in order of preference; repeatable")
    volume = up_command.add_mutually_exclusive_group()
    volume.add_argument("--volume", metavar="NAME", help="a network volume of yours, mounted at /workspace")
    volume.add_argument("--volume-gb", type=int, metavar="GB", help="a new volume on the pod's host (>= 10 GB)")
    up_command.add_argument("--cloud", choices=("secure", "community"), default="secure")
    up_command.add_argument("--name", help="the pod's name (default: the template's target, e.g. vllm-pod-sm89)")
    up_command.add_argument("--max-price", type=float, metavar="DOLLARS", help="skip GPU types above DOLLARS an hour")
    many = up_command.add_mutually_exclusive_group()
    many.add_argument(
        "--workers",
        type=at_least_one,
        metavar="N",
        help="N pods behind a gateway pod (a CPU pod) that keeps each conversation on one of them",
    )
    many.add_argument(
        "--nodes",
        type=at_least_two,
        metavar="N",
        help="one model on a RunPod Instant Cluster of N nodes (its public image only), rank 0 serving",
    )
    up_command.add_argument(
        "--gpus-per-node",
        type=at_least_one,
        default=GPUS_PER_NODE,
        metavar="G",
        help=f"with --nodes, each node's GPUs (default {GPUS_PER_NODE})",
    )
    up_command.add_argument(
        "--gateway-cpu",
        default=GATEWAY_CPU,
        metavar="FLAVOR",
        help=f"the gateway's CPU flavour, with --workers (default {GATEWAY_CPU})",
    )
    watching(up_command)
    watching(actions.add_parser("watch", help="watch a pod boot until it serves")).add_argument("pod")
    watching(actions.add_parser("start", help="start a stopped pod and watch it boot")).add_argument("pod")
    actions.add_parser("gpus", help="RunPod's GPU types: memory, architecture, our image, prices, stock")
    status_command = actions.add_parser(
        "status", help="one line per pod of ours (a cluster: a line, then one per node): GPU, state, cost, URL, health"
    )
    status_command.add_argument("pod", nargs="?")
    actions.add_parser("stop", help="stop pods (their volumes stay); RunPod stops no cluster").add_argument(
        "pods", nargs="+", metavar="pod"
    )
    down_command = actions.add_parser("down", help="delete pods or clusters, after saying what goes with them")
    down_command.add_argument("pods", nargs="+", metavar="pod")
    down_command.add_argument("--yes", action="store_true", help="do not ask (needed without a terminal)")
    replace_command = watching(
        actions.add_parser(
            "replace",
            help="recreate a pod on another host (a sick one, or one "
            "whose GPUs are taken) from its template, then delete it",
        )
    )
    replace_command.add_argument("pod")
    replace_command.add_argument(
        "--gpu", action="append", default=[], help="a GPU type (default: the pod's, then its target's)"
    )
    replace_command.add_argument("--yes", action="store_true", help="do not ask when a volume on its host goes with it")
    replace_command.add_argument(
        "--max-price", type=float, metavar="DOLLARS", help="skip GPU types above DOLLARS an hour"
    )


def at_least_one(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of pods, at least 1")
    return int(text)


def at_least_two(text: str) -> int:
    if not text.isdigit() or int(text) < MIN_NODES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number of nodes, at least {MIN_NODES} (one is a pod)"
        )
    return int(text)


def watching(command: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of a command that watches a boot and ends with a check through the pod's bridge."""
    command.add_argument("--key", help=f"one of the pod's VL_API_KEYS (default: {KEY_DEFAULT})")
    command.add_argument("--timeout", type=float, default=30.0, metavar="MIN", help="stop watching after MIN")
    return command


HELD = (KEY_VARIABLE, "HF_TOKEN", "HF_READ_TOKEN")  # the keys a `pod` command holds, never shown whatever quotes them


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
                nodes=args.nodes,
                gpus_per_node=args.gpus_per_node,
                gateway_cpu=args.gateway_cpu,
                max_price=args.max_price,
            )
            return up(pods, request, watching)
        case "watch":
            return watch(pods, args.pod, watching)
        case "start":
            return start(pods, args.pod, watching)
        case "replace":
            return replace(pods, args.pod, args.gpu, args.yes, watching, args.max_price)
        case "status":
            return status(pods, args.pod)
        case "gpus":
            return gpus(pods)
        case "stop":
            return stop(pods, args.pods)
        case "down":
            return down(pods, args.pods, args.yes)
    raise ValueError(f"no pod action {args.action!r}")  # argparse's choices: never
