"""`pod status`: one line per pod of ours (or the one named): its machine, state, cost, uptime, URL, and whether it
serves."""

from __future__ import annotations

from runtime.client.columns import print_columns
from runtime.client.pods.boot import health
from runtime.client.pods.facade import Pods, machine
from runtime.health import health_answer, serves_model
from runtime.runpod.payloads import Pod
from runtime.runpod.proxy import proxy_url


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
