"""The model's files from the Hub into the cache (`python -m runtime weights`, which `runtime start` runs too):
the real huggingface_hub client against the test Hub, which serves the tiny model as a real model repo
(safetensors through an LFS redirect to another origin, as the Hub's CDN). Where the cache lives: on the
volume when one is mounted, read from /proc/self/mountinfo."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.engine.tinymodel import write_tiny_model
from runtime.engine.volume import cache_env, cache_root, is_mount_point, make_cache_dirs
from runtime.engine.weights import COMPLETE, is_complete, repo_folder
from runtime.settings import load_settings
from runtime.units import human_bytes
from tests.support.environ import outer_environ
from tests.support.hub_lies import HostileHub, Lies
from tests.support.hub_server import HubServer
from tests.support.polling import wait_for_log_line, wait_until

pytestmark = pytest.mark.slow  # downloads from the test Hub, one killed on purpose

REPO_ROOT = Path(__file__).resolve().parents[2]
REPO = f"{HubServer.owner}/tiny-weights"
WEIGHTS = "model.safetensors"
# A line of /proc/self/mountinfo per mount: a RunPod volume, a Docker bind mount (same filesystem as its
# parent: os.path.ismount misses it), and a path with a space (written `\040`).
MOUNTINFO = """\
22 1 0:21 / / rw,relatime - overlay overlay rw
35 22 259:1 /pods/abc /workspace rw,relatime - ext4 /dev/nvme0n1p1 rw
36 22 0:21 /srv/data /data rw,relatime - overlay overlay rw
37 22 259:1 /x /my\\040volume rw,relatime - ext4 /dev/nvme0n1p1 rw
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("model") / "tiny"
    write_tiny_model(folder)
    return folder


@pytest.fixture()
def hub(model: Path) -> Iterator[HubServer]:
    with HubServer() as server:
        server.create_repo(REPO)
        server.put_folder(REPO, model)
        yield server


def weights_env(hub: HubServer, cache: Path, repo: str = REPO) -> dict[str, str]:
    outer = outer_environ()
    return (
        outer
        | hub.env(hub.read_token)
        | {
            "VL_MODEL": "tiny",
            "VL_REPO": repo,
            "VL_CACHE_DIR": str(cache),
            "VL_STATE_DIR": str(cache.parent / "state"),
            "VL_VENV": sys.prefix,
        }
    )


def fetch(env: dict[str, str], stderr: Path) -> subprocess.Popen:
    with stderr.open("w") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "runtime", "weights"],
            cwd=REPO_ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(cache: Path) -> Path:
    folder = repo_folder(cache / "huggingface" / "hub", REPO)
    return folder / "snapshots" / (folder / "refs" / "main").read_text()


# --- where the cache lives ---


def test_a_mounted_volume_is_found_in_mountinfo_even_as_a_bind_mount() -> None:
    assert is_mount_point("/workspace", MOUNTINFO) and is_mount_point("/workspace/", MOUNTINFO)
    assert is_mount_point("/data", MOUNTINFO) and is_mount_point("/my volume", MOUNTINFO)
    assert not is_mount_point("/workspace/models", MOUNTINFO) and not is_mount_point("/opt", MOUNTINFO)


def test_the_cache_goes_to_the_volume_when_mounted_else_the_container_disk(tmp_path: Path) -> None:
    state = {"VL_STATE_DIR": "/var/lib/vlpod"}
    assert cache_root(load_settings(state), MOUNTINFO) == Path("/workspace/vllm-pod-cache")
    assert cache_root(load_settings(state | {"VL_VOLUME": "/opt"}), MOUNTINFO) == Path("/var/lib/vlpod/cache")
    assert cache_root(load_settings(state | {"VL_CACHE_DIR": "/data/c"}), MOUNTINFO) == Path("/data/c")
    make_cache_dirs(tmp_path / "cache")
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o750
    assert all(Path(folder).is_dir() and folder.startswith(str(tmp_path / "cache"))
               for folder in cache_env(tmp_path / "cache").values())  # fmt: skip


# --- downloading ---


def test_a_first_fetch_downloads_the_repo_and_a_second_asks_the_hub_nothing(
    hub: HubServer, model: Path, tmp_path: Path
) -> None:
    env = weights_env(hub, tmp_path / "cache")
    first = subprocess.run(
        [sys.executable, "-m", "runtime", "weights"], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert first.returncode == 0, first.stderr
    assert f"downloading {REPO} (revision " in first.stderr and f"downloaded {REPO}: 1.9 MB" in first.stderr
    assert sha256(snapshot(tmp_path / "cache") / WEIGHTS) == sha256(model / WEIGHTS)
    lfs = [r for r in hub.received if r.path.startswith("/lfs-objects/")]
    assert [(r.method, r.status) for r in lfs] == [("GET", 200)]  # the safetensors, from the object store
    assert "authorization" not in lfs[0].headers  # the token stays with the Hub
    assert is_complete(tmp_path / "cache" / "huggingface" / "hub", REPO)
    assert snapshot(tmp_path / "cache").name == hub.commits(REPO)[-1].oid  # main: the commit the Hub listed
    asked = len(hub.received)
    second = subprocess.run(
        [sys.executable, "-m", "runtime", "weights"], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert second.returncode == 0 and "nothing to download" in second.stderr, second.stderr
    assert len(hub.received) == asked


def test_a_killed_download_keeps_its_finished_files_and_drops_its_partial_one(
    hub: HubServer, model: Path, tmp_path: Path
) -> None:
    """huggingface_hub 2.4 restarts a file cut off over plain HTTP (each attempt writes its own temporary
    file: huggingface_hub#4228); the real Hub's Xet transfers resume from their chunk cache (HF_XET_CACHE,
    on the volume), which this test Hub does not serve. What a restart keeps here: every finished file."""
    env, cache = weights_env(hub, tmp_path / "cache"), tmp_path / "cache"
    blobs = repo_folder(cache / "huggingface" / "hub", REPO) / "blobs"
    with hub.throttle(64 * 1024):  # 1.7 MB of safetensors at 64 kB/s: ~26 s, long enough to stop it midway
        first = fetch(env, tmp_path / "first.log")
        wait_for_log_line(
            (tmp_path / "first.log").read_text, rf"downloading {REPO}: [\d.]+ [kM]B of 1\.9 MB \(\d+%\)", 120
        )
        finished = wait_until(lambda: len(done := [b for b in blobs.iterdir() if b.suffix != ".incomplete"]) == 5 and done,
                              "every file but the safetensors", 120)  # fmt: skip
        os.killpg(first.pid, signal.SIGKILL)  # as a pod's stop would, mid-file
        first.wait()
    assert len(list(blobs.glob("*.incomplete"))) == 1 and not is_complete(cache / "huggingface" / "hub", REPO)
    # The Hub records a request once its answer ends: the cut-off one, at its next write to the dead socket.
    wait_until(
        lambda: any(r.path.startswith("/lfs-objects/") for r in hub.received), "the cut-off download's record", 30
    )
    asked = len(hub.received)
    second = subprocess.run(
        [sys.executable, "-m", "runtime", "weights"], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert second.returncode == 0, second.stderr
    assert "removed 1 partial file a stopped download left" in second.stderr
    downloads = [r.path.rsplit("/", 1)[1] for r in hub.received[asked:] if r.method == "GET" and "/resolve/" in r.path]
    assert downloads == [], "finished files were downloaded again"
    assert [r.method for r in hub.received[asked:] if r.path.startswith("/lfs-objects/")] == ["GET"]
    assert sha256(snapshot(cache) / WEIGHTS) == sha256(model / WEIGHTS)
    assert set(finished) <= set(blobs.iterdir()) and not list(blobs.glob("*.incomplete"))


def test_a_repo_the_token_cannot_read_stops_with_one_line(hub: HubServer, tmp_path: Path) -> None:
    env = weights_env(hub, tmp_path / "cache", f"{HubServer.owner}/no-such-model")
    result = subprocess.run(
        [sys.executable, "-m", "runtime", "weights"], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"the Hub has no model repo {HubServer.owner}/no-such-model that HF_TOKEN may read"), (
        result.stderr
    )
    assert "Traceback" not in result.stderr and hub.read_token not in result.stderr


def test_a_generated_model_needs_no_download(hub: HubServer, tmp_path: Path) -> None:
    env = weights_env(hub, tmp_path / "cache", "") | {"VL_STATE_DIR": str(tmp_path / "state")}
    result = subprocess.run(
        [sys.executable, "-m", "runtime", "weights"], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0 and "nothing to download" in result.stderr and hub.received == []


# --- a hostile Hub: what it answers is checked before anything is written after it ---

# From the repo's cache folder (huggingface_hub writes `trees/<sha>.json`) up past VL_CACHE_DIR, into tmp_path.
FORGED_SHA = "../../../../../escaped"


def weights(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "weights"], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )


def test_a_revision_that_is_not_a_commit_id_is_refused_before_anything_is_written(model: Path, tmp_path: Path) -> None:
    cache, state = tmp_path / "cache", tmp_path / "state"
    with HostileHub(Lies(REPO, sha=FORGED_SHA)) as hub:
        hub.create_repo(REPO)
        hub.put_folder(REPO, model)
        result = weights(weights_env(hub, cache))
        asked = [(r.method, r.path) for r in hub.received if REPO in r.path]
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"the Hub answered {REPO}'s revision as '{FORGED_SHA}', not a 40-hex commit id: nothing was downloaded "
        "(check HF_ENDPOINT)"
    )
    assert "Traceback" not in result.stderr
    outside = [p for p in tmp_path.rglob("*") if not (p.is_relative_to(cache) or p.is_relative_to(state))]
    assert outside == [] and not (tmp_path / "escaped.json").exists()
    assert not repo_folder(cache / "huggingface" / "hub", REPO).exists()  # nothing named after it, inside either
    assert asked == [("GET", f"/api/models/{REPO}")]  # the listing only: no tree, no file


def test_a_file_served_smaller_than_listed_leaves_the_repo_incomplete_and_is_fetched_again(
    model: Path, tmp_path: Path
) -> None:
    cache, listed, served = tmp_path / "cache", 1000 * 10**12, (model / WEIGHTS).stat().st_size
    hub_cache = cache / "huggingface" / "hub"
    with HostileHub(Lies(REPO, sizes={WEIGHTS: listed})) as hub:
        hub.create_repo(REPO)
        hub.put_folder(REPO, model)
        first = weights(weights_env(hub, cache))
        assert first.returncode == 2, first.stderr
        assert first.stderr.strip().splitlines()[-1] == (
            f"downloading {REPO}: {WEIGHTS} is listed at 1000.0 TB ({listed} bytes) but {human_bytes(served)} "
            f"({served} bytes) were served: removed, the next start downloads it again"
        )
        assert not is_complete(hub_cache, REPO) and not (repo_folder(hub_cache, REPO) / COMPLETE).exists()
        asked = len(hub.received)
        second = weights(weights_env(hub, cache))
        again = [r.method for r in hub.received[asked:] if r.path.startswith("/lfs-objects/")]
    assert second.returncode == 2 and again == ["GET"], second.stderr  # downloaded again, and refused again
    assert not is_complete(hub_cache, REPO)


def test_a_complete_record_with_a_revision_that_is_not_a_commit_id_is_not_complete(tmp_path: Path) -> None:
    """A record written before the Hub's answers were checked (or by hand) could send vLLM's offline start
    to a folder outside the cache: `snapshots/<revision>`."""
    folder = repo_folder(tmp_path / "hub", REPO)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(FORGED_SHA)
    (folder / COMPLETE).write_text(json.dumps({"revision": FORGED_SHA, "files": []}))
    assert not is_complete(tmp_path / "hub", REPO)
