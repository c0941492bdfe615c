"""VL_PRELOAD: other models' weights downloaded into the cache in the background once the first model serves, so that
a later swap downloads nothing. The real huggingface_hub client against the test Hub, which serves the tiny model as
real model repos; `python -m runtime preload` as the pod runs it, and the pod's side of it (its duty, `Preloading`)
with a real supervisor over a stand-in engine whose health the test decides.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from runtime.engine.command import engine_command
from runtime.engine.tinymodel import write_tiny_model
from runtime.engine.weights import is_complete, repo_folder
from runtime.pod.engines import Engines, Plan
from runtime.pod.preload import PID_FILE, Preloading, RedactingFormatter, relay
from runtime.pod.replicas import plan_replicas
from runtime.pod.supervisor import ChildSpec, Health, Supervisor
from runtime.redact import Redactor
from runtime.settings import load_settings
from runtime.state.preload import FILE, read_preload_state
from tests.support.bridge import pod_status, start_bridge, start_stand_in
from tests.support.browser import chromium
from tests.support.environ import outer_environ
from tests.support.hub_server import HubServer
from tests.support.polling import eventually, wait_until
from tests.support.signals import alive

REPO_ROOT = Path(__file__).resolve().parents[2]
OWNER = HubServer.owner
SERVED, OTHER, NEXT, MISSING = f"{OWNER}/tiny-served", f"{OWNER}/tiny-other", f"{OWNER}/tiny-next", f"{OWNER}/nothing"
WEIGHTS = "model.safetensors"
SLOW_BYTES_PER_S = 64 * 1024  # 1.7 MB of safetensors: ~26 s, long enough to look at the process mid-download
API_KEY = "sk-preload-test-0123456789"


# --- in one process: the relay of the child's lines, the redaction, the state file ---


def test_the_child_s_lines_keep_their_level_and_an_error_reaches_the_hub(caplog: pytest.LogCaptureFixture) -> None:
    told: list[str] = []
    with caplog.at_level(logging.INFO, logger="runtime.pod.preload"):
        relay("INFO downloading a/b (revision 0123456789ab): 6 files\n", told.append)
        relay("ERROR preload of a/c failed: the Hub has no model repo a/c\n", told.append)
        relay("a library's own print\n", told.append)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "downloading a/b (revision 0123456789ab): 6 files"),
        ("ERROR", "preload of a/c failed: the Hub has no model repo a/c"),
        ("INFO", "a library's own print"),
    ]
    assert told == ["preload of a/c failed: the Hub has no model repo a/c"]


def test_a_line_of_the_child_never_holds_the_token() -> None:
    token = "hf_" + "k" * 34
    formatter = RedactingFormatter("%(levelname)s %(message)s", Redactor.from_environ({"HF_TOKEN": token}))
    record = logging.LogRecord("runtime.pod.preload", logging.ERROR, __file__, 1, "failed: %s", (f"bad {token}",), None)
    assert token not in formatter.format(record) and formatter.format(record).startswith("ERROR failed: bad ")


def test_an_unreadable_state_file_reads_as_none(tmp_path: Path) -> None:
    assert read_preload_state(tmp_path) is None
    (tmp_path / FILE).write_text("{not json")
    assert read_preload_state(tmp_path) is None
    (tmp_path / FILE).write_text(json.dumps([{"repo": "a/b", "state": "done"}, {"repo": "a/c", "state": "odd"}, 3]))
    assert read_preload_state(tmp_path) == [{"repo": "a/b", "state": "done"}]


# --- `python -m runtime preload` against the test Hub ---


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("model") / "tiny"
    write_tiny_model(folder)
    return folder


@pytest.fixture()
def hub(model: Path) -> Iterator[HubServer]:
    with HubServer() as server:
        for repo in (SERVED, OTHER, NEXT):
            server.create_repo(repo)
            server.put_folder(repo, model)
        yield server


def pod_env(hub: HubServer, root: Path) -> dict[str, str]:
    """A pod's environment: its cache and state folders under `root`, the test Hub with a read token."""
    return outer_environ() | hub.env(hub.read_token) | {
        "VL_CACHE_DIR": str(root / "cache"), "VL_STATE_DIR": str(root / "state"), "VL_VENV": sys.prefix,
    }  # fmt: skip


def hub_cache(root: Path) -> Path:
    return root / "cache" / "huggingface" / "hub"


def run_preload(env: dict[str, str], *repos: str) -> subprocess.CompletedProcess[str]:
    Path(env["VL_STATE_DIR"]).mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "runtime", "preload", *repos], cwd=REPO_ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def snapshot_file(root: Path, repo: str, name: str = "") -> Path:
    folder = repo_folder(hub_cache(root), repo)
    return folder / "snapshots" / (folder / "refs" / "main").read_text() / name


def size_in_cache(root: Path, repo: str) -> int:
    """What the repo's files in the cache weigh: the total the Hub listed for them."""
    return sum(path.stat().st_size for path in snapshot_file(root, repo).rglob("*") if path.is_file())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def nice_of_threads(pid: int) -> set[int]:
    """The nice value of each thread of `pid` (Linux keeps it per thread): field 19 of /proc/…/task/…/stat."""
    return {int(stat.read_text().rsplit(")", 1)[1].split()[16]) for stat in Path(f"/proc/{pid}/task").glob("*/stat")}


@pytest.mark.slow
def test_a_preloaded_repo_is_complete_for_the_engine_which_then_downloads_nothing(
    hub: HubServer, model: Path, tmp_path: Path
) -> None:
    env = pod_env(hub, tmp_path)
    result = run_preload(env, OTHER)
    assert result.returncode == 0, result.stdout
    assert read_preload_state(tmp_path / "state") == [
        {"repo": OTHER, "state": "done", "total": size_in_cache(tmp_path, OTHER)}
    ]
    assert sha256(snapshot_file(tmp_path, OTHER, WEIGHTS)) == sha256(model / WEIGHTS)
    assert is_complete(hub_cache(tmp_path), OTHER)
    assert "one file at a time, nice 19" in result.stdout and f"INFO downloaded {OTHER}: 1.9 MB" in result.stdout
    assert hub.read_token not in result.stdout
    asked = len(hub.received)
    # The engine's own preparation for that repo, as a swap to it would run it: it finds it complete.
    weights = subprocess.run([sys.executable, "-m", "runtime", "weights"], cwd=REPO_ROOT, capture_output=True,
                             text=True, env=env | {"VL_MODEL": "tiny", "VL_REPO": OTHER})  # fmt: skip
    assert weights.returncode == 0, weights.stderr
    assert f"weights of {OTHER}: complete in" in weights.stderr and "downloading" not in weights.stderr
    assert hub.received[asked:] == []


@pytest.mark.slow
def test_a_missing_repo_is_said_in_one_line_the_next_still_downloads_and_the_console_shows_both(
    hub: HubServer, model: Path, tmp_path: Path
) -> None:
    env = pod_env(hub, tmp_path)
    result = run_preload(env, MISSING, NEXT)
    assert result.returncode == 1, result.stdout
    errors = [line for line in result.stdout.splitlines() if line.startswith("ERROR")]
    assert errors == [
        f"ERROR preload of {MISSING} failed: the Hub has no model repo {MISSING} that HF_TOKEN may read (check "
        "VL_PRELOAD, the token, and the model's terms): RepositoryNotFoundError; the other repos are still downloaded"
    ], result.stdout
    assert "Traceback" not in result.stdout and hub.read_token not in result.stdout
    assert is_complete(hub_cache(tmp_path), NEXT) and not is_complete(hub_cache(tmp_path), MISSING)
    missing, following = read_preload_state(tmp_path / "state") or []
    assert missing["state"] == "failed" and missing["reason"].startswith(f"the Hub has no model repo {MISSING}")
    assert following == {"repo": NEXT, "state": "done", "total": size_in_cache(tmp_path, NEXT)}
    # The console's data: the bridge reads the file from the pod's state folder.
    with start_stand_in(tmp_path / "upstream.log") as upstream:
        settings = {"VL_STATE_DIR": env["VL_STATE_DIR"], "VL_API_KEYS": API_KEY}
        with start_bridge(upstream.url, tmp_path / "bridge.log", settings) as bridge:
            assert pod_status(bridge.url, API_KEY)["preload"] == [missing, following]
            with chromium() as browser:
                lines = console_lines(browser, bridge.url)
            assert lines == [
                f"preload {MISSING}: failed {missing['reason']}",
                f"preload {NEXT}: done 1.9 MB in the cache",
            ]


def console_lines(browser: Browser, url: str) -> list[str]:
    """The console's preload lines, as Debian's chromium shows them once logged in."""
    page = browser.new_page()
    try:
        page.goto(f"{url}/console")
        page.get_by_test_id("key-input").fill(API_KEY)
        page.get_by_test_id("key-submit").click()
        expect(page.get_by_test_id("preload-repo")).to_have_count(2, timeout=60_000)
        return [" ".join(text.split()) for text in page.get_by_test_id("preload-repo").all_inner_texts()]
    finally:
        page.close()


@pytest.mark.slow
def test_the_preload_runs_at_nice_19_in_the_idle_io_class_and_names_no_token(hub: HubServer, tmp_path: Path) -> None:
    env = pod_env(hub, tmp_path)
    (tmp_path / "state").mkdir()
    with hub.throttle(SLOW_BYTES_PER_S), (tmp_path / "preload.log").open("w") as sink:
        child = subprocess.Popen([sys.executable, "-m", "runtime", "preload", OTHER], cwd=REPO_ROOT, env=env,
                                 stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            # Bytes on disk: its download threads and its progress thread are running.
            wait_until(lambda: (read_preload_state(tmp_path / "state") or [{}])[0].get("done"), "bytes downloaded", 120)
            assert nice_of_threads(child.pid) == {19}
            if shutil.which("ionice"):
                ionice = subprocess.run(["ionice", "-p", str(child.pid)], capture_output=True, text=True, check=True)
                assert ionice.stdout.strip() == "idle"
        finally:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert hub.read_token not in (tmp_path / "preload.log").read_text()


# --- the pod's side: after the first engine serves, a one-shot child, killed when the pod stops ---


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class StandInEngine:
    """The engine's place in the supervisor: a sleeping process whose health the test decides, probes counted."""

    def __init__(self) -> None:
        self.serving, self.probes = False, 0

    async def probe(self) -> bool:
        self.probes += 1
        return self.serving


@pytest.fixture
async def pod(hub: HubServer, tmp_path: Path) -> AsyncIterator[tuple[Preloading, StandInEngine, list[str]]]:
    """The pod's preload duty, on a pod serving SERVED with VL_PRELOAD naming SERVED and OTHER, its engine a
    stand-in; what it says to the Hub log."""
    env = pod_env(hub, tmp_path) | {"VL_MODEL": "tiny", "VL_REPO": SERVED, "VL_PRELOAD": f"{SERVED} {OTHER}"}
    (tmp_path / "state").mkdir()
    settings = load_settings(env)
    supervisor = Supervisor(tmp_path / "state")
    engines = Engines(settings, supervisor, lambda replica: ChildSpec(replica.name, []))
    command = engine_command(settings, environ=env)
    engines.plan = Plan(settings, command, plan_replicas(settings, command, "cpu", 0))  # as Engines.prepare leaves it
    told: list[str] = []
    engine = StandInEngine()
    health = Health(
        engine.probe, interval_s=0.05, timeout_s=5.0, failures_before_restart=10**6, starting_interval_s=0.05
    )
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    supervisor.start(ChildSpec(engines.replicas[0].name, sleeper, dict(env), health))
    try:
        yield Preloading(engines, env, told.append), engine, told
    finally:
        await supervisor.stop()


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_pod_preloads_once_its_engine_serves_and_the_child_dies_with_it(
    pod: tuple[Preloading, StandInEngine, list[str]],
    hub: HubServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    running, engine, told = pod
    state = tmp_path / "state"
    caplog.set_level(logging.INFO, logger="runtime.pod.preload")
    preloading = asyncio.create_task(running.run())
    try:
        await eventually(lambda: engine.probes >= 5)  # asked five times, and not serving yet: nothing starts
        assert read_preload_state(state) == [{"repo": OTHER, "state": "waiting"}]  # the repo it serves is skipped
        assert not (state / PID_FILE).exists() and hub.received == []
        with hub.throttle(SLOW_BYTES_PER_S):
            engine.serving = True
            await eventually(lambda: (read_preload_state(state) or [{}])[0].get("state") == "downloading", 60)
            pid = int((state / PID_FILE).read_text())
            assert nice_of_threads(pid) == {19}
            preloading.cancel()  # as the pod's stop does
            with pytest.raises(asyncio.CancelledError):
                await preloading
        assert not alive(pid) and not (state / PID_FILE).exists()
        assert not is_complete(hub_cache(tmp_path), OTHER)
    finally:
        preloading.cancel()
    # The next start's preload takes it up, and this one runs to its end.
    await asyncio.wait_for(running.run(), 120)
    assert read_preload_state(state) == [{"repo": OTHER, "state": "done", "total": size_in_cache(tmp_path, OTHER)}]
    assert is_complete(hub_cache(tmp_path), OTHER) and not repo_folder(hub_cache(tmp_path), SERVED).exists()
    lines = [record.getMessage() for record in caplog.records if record.name == "runtime.pod.preload"]
    assert any(line.startswith(f"downloaded {OTHER}: 1.9 MB") for line in lines), lines
    assert told == [] and not any(hub.read_token in line for line in lines)
