"""Watching a pod boot, for `up`, `watch`, `start` and `replace`: its Hub log and its state on one live line until it
serves, then Claude Code's environment and the pod's self-check verdict; its `/health` through RunPod's proxy."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

from runtime.checks.bounded import Limits, request_sync
from runtime.checks.endpoint import check_endpoint
from runtime.client.environment import print_environment
from runtime.client.identity import pod_key, remember_pod
from runtime.client.pods.facade import Pods
from runtime.headers import USER_AGENT
from runtime.health import health_answer, serves_model
from runtime.liveline import LiveLine
from runtime.logsafe import terminal_line
from runtime.runpod.api import RunPodError
from runtime.runpod.proxy import proxy_url
from runtime.units import human_seconds

POLL_S = 5.0
LOG_LINE_CHARS = 300
HEALTH_TIMEOUT_S = 10.0  # the whole request, its answer read to the end
HEALTH_BYTES = 1 << 20  # a /health answer is a few hundred bytes; a proxy's error page a few kB
VERDICT_CHARS = 300  # of the self-check's verdict, as printed
GONE = ("EXITED", "ERROR", "TERMINATED")


@dataclass(frozen=True)
class Watching:
    """How a command that watches a boot asks the pod at the end (its key), and for how long it watches."""

    key: str | None
    timeout_min: float

    def deadline(self) -> float:
        """When the watching that starts now stops (time.monotonic's clock)."""
        return time.monotonic() + self.timeout_min * 60


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
    """`checked` of the pod's /health as a key's holder reads it, as a terminal may show it (no control, one line);
    None when it cannot be read."""
    answer = health(url, key)
    verdict = health_answer(answer[1]).get("checked") if answer is not None else None
    return terminal_line(verdict, VERDICT_CHARS) if isinstance(verdict, str) else None


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


def health(url: str, key: str | None = None, deadline_s: float = HEALTH_TIMEOUT_S) -> tuple[int, bytes] | None:
    """The pod's /health through RunPod's proxy (status, body), as a key's holder reads it when `key` is given; None
    while it cannot be reached."""
    headers = {"user-agent": USER_AGENT} | ({"x-api-key": key} if key else {})
    try:  # the whole answer within its deadline and HEALTH_BYTES: a proxy that drips or floods is "not yet"
        response = request_sync(url, headers, "GET", "/health", Limits(deadline_s, HEALTH_BYTES))
    except httpx.HTTPError:
        return None
    return response.status_code, response.content
