"""What one bridge process shares across requests: the upstream pool, the model catalog, the keys,
the metrics, usage and GPU telemetry, and the limits read from the settings. Handlers and streams read
it; nothing here serves.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from runtime.bridge.answer import Serving
from runtime.bridge.auth import AllowedHosts, ApiKeys
from runtime.bridge.budgets import Budgets
from runtime.bridge.capacity import CapacityWatch
from runtime.bridge.ledger import Ledger, totals_of
from runtime.bridge.metrics import Metrics
from runtime.bridge.models import Catalog
from runtime.bridge.sessions import Sessions
from runtime.bridge.sharing import key_cap
from runtime.bridge.swaps import Swaps
from runtime.bridge.upstream import Upstream
from runtime.bridge.usage import Recorder, Usage
from runtime.image import public_facts, read_image_facts
from runtime.logfiles import ENGINE, log_file
from runtime.settings import Settings
from runtime.state.activity import Activity
from runtime.state.benchreport import kept_bench
from runtime.state.dpranks import DownRanks
from runtime.telemetry import GpuTelemetry


class Bridge:
    """Everything one bridge process shares: the upstream pool, the model catalog, keys, metrics."""

    def __init__(
        self,
        upstream_url: str,
        settings: Settings,
        max_connections: int = 512,
        pool_timeout: float = 10.0,
        engines: Sequence[str] = (),
        ledger: Path | None = None,
        thinks_unasked: bool = False,
        data_parallel: int = 1,
    ) -> None:
        gateway_key = (settings.worker_key or "") if settings.role == "gateway" else None  # "": open workers
        if gateway_key is not None:  # its pods, from VL_WORKERS in its environment: never on a command line
            engines = settings.workers
        self.upstream = Upstream(upstream_url, max_connections, pool_timeout, engines, gateway_key)
        self.catalog = Catalog(settings.aliases, thinks_unasked)
        self.metrics = Metrics(lambda: self.upstream.in_use)
        self.keys = ApiKeys.for_pod(settings)
        self.hosts = AllowedHosts.for_pod(settings.allowed_hosts, os.environ)
        # What every answer is handed: these, and the settings that shape an answer.
        self.swaps = (
            Swaps(settings.swap, Path(settings.state_dir), self.catalog, self.upstream) if settings.swap else None
        )
        if self.swaps is not None:
            self.catalog.others = self.swaps.others
        self.serving = Serving(
            self.upstream,
            self.catalog,
            self.metrics.open_streams,
            settings.bridge_ping_s,
            settings.client_stall_s,
            settings.log_prompts,
            self.swaps,
            guard=settings.guard,
            count_blocked_write=self.metrics.count_blocked_write,
            data_parallel=data_parallel,
            down_ranks=DownRanks(Path(settings.state_dir)) if data_parallel > 1 else frozenset,
        )
        self.max_body: int = settings.max_body_mb * 2**20
        self.key_concurrency: int | None = key_cap(max_connections, len(self.keys.labels), settings.key_concurrency)
        # Each key's totals across restarts, when the pod gives a ledger (on its volume).
        self.ledger = Ledger(ledger) if ledger is not None else None
        self.bench_folder = ledger.parent if ledger is not None else Path(settings.state_dir)  # the last bench's
        self.bench = kept_bench(self.bench_folder)
        days = self.ledger.load() if self.ledger is not None else {}
        # Each key's budgets, counted from the ledger's days (VL_API_KEYS `name:key:5usd/day`).
        self.budgets = Budgets(settings.api_keys, settings.cost_per_hour, days)
        recorders: list[Recorder] = [self.ledger.record] if self.ledger is not None else []
        if self.budgets:
            recorders.append(self.budgets.record)
        self.usage = Usage(totals=totals_of(days), recorders=recorders)
        self.sessions = Sessions(kept=frozenset(caller.label for caller, _ in self.keys.keys if caller.admin))
        self.capacity = CapacityWatch()  # sampled by create_app's lifespan and each status call
        self.telemetry = GpuTelemetry(on_sample=self.metrics.show_gpus)  # sampling: create_app's lifespan
        self.state_dir = Path(settings.state_dir)
        # The console shows its tail while the engines start (the first one's, when there are several).
        self.engine_log = log_file(Path(settings.state_dir), ENGINE if len(engines) < 2 else f"{ENGINE}-0")
        # What VL_IDLE_STOP_MIN measures; without it, no file is touched per request.
        self.activity = Activity(Path(settings.state_dir)) if settings.idle_stop_min else None
        facts = read_image_facts(Path(settings.prebaked_marker))
        self.image = public_facts(facts) if facts is not None else None
        self.cost_per_hour: float | None = settings.cost_per_hour
