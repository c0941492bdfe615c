"""`pod down`: pods deleted, after saying what goes with each (asked at a terminal, else `--yes`)."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.client.pods.facade import Pods, confirm, going


def down(pods: Pods, pod_ids: Sequence[str], yes: bool) -> int:
    what = {pod_id: going(pods.get(pod_id)) for pod_id in pod_ids}
    confirm(f"deleting {'; '.join(what.values())}", yes)
    for pod_id, said in what.items():
        pods.api.delete_pod(pod_id)
        print(f"deleted {said}")
    return 0
