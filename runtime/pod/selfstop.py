"""The pod stopping itself (VL_IDLE_STOP_MIN, VL_MAX_SPEND): idle for too long, or over its budget, it
says so in its log and its Hub log first, then asks RunPod to stop it.

RunPod gives every pod its id (`RUNPOD_POD_ID`) and an API key scoped to that pod (`RUNPOD_API_KEY`);
its docs stop a pod from inside it with them (`runpodctl stop pod $RUNPOD_POD_ID`). Without them (not on
RunPod) these settings stop start-up with one line: a pod that cannot stop itself must not promise to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runtime.pod.engines import Engines
from runtime.pod.hubside import LAST_WORDS_S, PodHub
from runtime.settings import Settings, SettingsError, as_text
from runtime.state.activity import last_activity

log = logging.getLogger(__name__)

CHECK_S = 30.0  # how often the pod looks: a minute's idleness or a cent's spend is noticed within it


@dataclass
class SelfStop:
    """When this pod stops itself, and how it asks RunPod to."""

    pod_id: str
    api_key: str = field(repr=False)
    idle_s: float | None
    max_spend: float | None
    state_dir: Path
    started: float = field(default_factory=time.time)
    check_s: float = CHECK_S

    @classmethod
    def from_settings(cls, settings: Settings, environ: Mapping[str, str]) -> SelfStop | None:
        """None when neither setting is set; SettingsError when the pod could not keep the promise."""
        if not (settings.idle_stop_min or settings.max_spend):
            return None
        name, value = (
            ("VL_IDLE_STOP_MIN", settings.idle_stop_min)
            if settings.idle_stop_min
            else ("VL_MAX_SPEND", settings.max_spend)
        )
        missing = [variable for variable in ("RUNPOD_POD_ID", "RUNPOD_API_KEY") if not environ.get(variable)]
        if missing:
            raise SettingsError(
                name,
                as_text(value),
                "empty outside RunPod: a pod stops itself with the RUNPOD_POD_ID "
                f"and RUNPOD_API_KEY RunPod gives it, and this one has no {' and no '.join(missing)}",
            )
        if settings.max_spend and settings.cost_per_hour is None:
            raise SettingsError(
                "VL_MAX_SPEND",
                as_text(settings.max_spend),
                "empty without VL_COST_PER_HOUR, which the spend is counted from",
            )
        idle_s = settings.idle_stop_min * 60 if settings.idle_stop_min else None
        return cls(
            environ["RUNPOD_POD_ID"], environ["RUNPOD_API_KEY"], idle_s, settings.max_spend, Path(settings.state_dir)
        )

    def reason(self, now: float, cost_per_hour: float | None) -> str | None:
        """Why the pod should stop now, or None."""
        if self.idle_s is not None:
            idle_s = now - max(self.started, last_activity(self.state_dir) or 0.0)
            if idle_s >= self.idle_s:
                return f"no request served for {idle_s / 60:.1f} min (VL_IDLE_STOP_MIN={self.idle_s / 60:g})"
        if self.max_spend is not None and cost_per_hour is not None:
            spent = (now - self.started) / 3600 * cost_per_hour
            if spent >= self.max_spend:
                return f"this start of the pod has cost ${spent:.2f} (VL_MAX_SPEND={self.max_spend:g})"
        return None

    def stop(self) -> None:
        """Ask RunPod to stop this pod (it then sends SIGTERM: the pod stops as on `docker stop`); RunPodError."""
        from runtime.runpod.api import RunPodClient  # httpx: not on the light path to vLLM's launch

        with RunPodClient(self.api_key) as api:
            api.stop_pod(self.pod_id)


class SelfStopping:
    """The duty: a periodic look at the clock and the activity file; once `policy` says why, the reason said in the
    Hub log first, then RunPod stops the pod (and sends SIGTERM); a refused stop is said and tried again."""

    def __init__(self, policy: SelfStop, engines: Engines, hub: PodHub) -> None:
        self.policy, self.engines, self.hub = policy, engines, hub

    async def run(self) -> None:
        from runtime.runpod.api import RunPodError  # httpx: not on the light path to vLLM's launch

        policy = self.policy
        while True:
            await asyncio.sleep(policy.check_s)
            reason = policy.reason(time.time(), self.engines.settings.cost_per_hour)
            if reason is None:
                continue
            line = f"stopping this pod: {reason}"
            log.warning("%s", line)
            await asyncio.to_thread(self.hub.say_and_wait, line, LAST_WORDS_S)
            try:
                await asyncio.to_thread(policy.stop)
            except RunPodError as error:
                refusal = f"could not stop this pod: {error}; trying again in {policy.check_s:g} s"
                log.error("%s", refusal)
                self.hub.say(refusal)
                continue
            log.info("RunPod is stopping this pod")
            return
