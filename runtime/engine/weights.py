"""The model's files from the Hub, fetched before vLLM starts: with progress in the boot log, taken up again
after a restart (finished files are kept; Xet transfers resume from their chunk cache, HF_XET_CACHE, on the
volume), and never asked for again once complete (vLLM then starts with HF_HUB_OFFLINE=1).

The seeds' pods spent ~20 s of every start on Hub calls and re-downloaded weights after each stop;
vLLM's own download shows no progress in any log a user can read while the pod has no SSH yet.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from runtime.logsafe import one_line
from runtime.settings import is_commit_id
from runtime.state.statefile import write_atomically
from runtime.units import human_bytes

log = logging.getLogger(__name__)

REPORT_EVERY_S = 5.0  # a progress line in the boot log (and so in the Hub log) at most this often
COMPLETE = "vllm-pod-complete.json"  # in a repo's cache folder: the revision and files known complete
LOCKS = ".locks"  # in the hub cache, where huggingface_hub keeps its own per-file locks
# vLLM loads safetensors when a repo has them: other weight formats and the originals are never read.
SKIPPED_WITH_SAFETENSORS = re.compile(r"(?:^|/)original/|\.(?:bin|pt|pth|gguf|onnx|h5|msgpack|ckpt)$")


class WeightsError(RuntimeError):
    """The weights cannot be fetched; `str()` is one line naming the repo and the fix."""


@dataclass(frozen=True)
class Share:
    """How much of the pod's network a download takes (not a cap in bytes/s: neither huggingface_hub 2.4 nor hf_xet
    offers one), and how often it says how far it is in the log."""

    files_at_once: int = 8  # huggingface_hub's default
    # Xet's parallel transfers: the seeds' 135 GB took ~25 min without them. Read by hf_xet at its first use.
    xet_high_performance: bool = True
    report_every_s: float = REPORT_EVERY_S


FULL = Share()  # a start waits on it: as fast as the Hub and the network go


@dataclass(frozen=True)
class Listing:
    """What a repo holds at its current revision (a commit id): the files vLLM reads, the sizes the Hub lists
    for them, and their total size."""

    revision: str
    files: tuple[str, ...]
    size: int
    sizes: Mapping[str, int]


def repo_folder(cache: Path, repo: str) -> Path:
    """huggingface_hub's folder for a model repo in the hub cache."""
    return cache / ("models--" + repo.replace("/", "--"))


def is_complete(cache: Path, repo: str) -> bool:
    """Whether a download of `repo` finished, its revision (a commit id) is still the one `main` points to in the
    cache, and every file it listed is there: then nothing needs the Hub, and vLLM may start offline."""
    folder = repo_folder(cache, repo)
    try:
        record = json.loads((folder / COMPLETE).read_text())
        main = (folder / "refs" / "main").read_text().strip()
    except (OSError, ValueError):
        return False
    if not is_commit_id(main):  # `snapshots/<main>` would be a folder anywhere: vLLM's offline start reads it
        return False
    snapshot = folder / "snapshots" / main
    return record.get("revision") == main and all((snapshot / name).is_file() for name in record.get("files", []))


def ensure_weights(repos: Iterable[str], cache: Path) -> None:
    """Download every repo not complete in `cache` (keeping the files a stopped start finished); WeightsError
    when the Hub refuses, or answers what cannot be so (a revision that is not a commit id, a file not the size
    listed). Reads HF_ENDPOINT and HF_TOKEN from the environment, like vLLM."""
    for repo in repos:
        if is_complete(cache, repo):
            log.info("weights of %s: complete in %s, nothing to download (vLLM starts offline)", repo, cache)
        else:
            download(repo, cache)


def download(
    repo: str,
    cache: Path,
    share: Share = FULL,
    on_progress: Callable[[int, int], None] | None = None,
    setting: str = "VL_REPO",
) -> Listing:
    """Download `repo` into `cache` at `share`, telling `on_progress` (bytes on disk, total) as it goes, and return
    what it holds; WeightsError in one line naming `setting` (the variable that named the repo) when the Hub has no
    such repo for the token."""
    if share.xet_high_performance:
        os.environ["HF_XET_HIGH_PERFORMANCE"] = "1"
    else:
        os.environ.pop("HF_XET_HIGH_PERFORMANCE", None)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    from huggingface_hub.utils.tqdm import disable_progress_bars

    disable_progress_bars()  # the lines below say the same in the boot log, without a bar's carriage returns
    folder = repo_folder(cache, repo)
    with downloading(cache, folder):
        try:
            listing = list_repo(repo)
            log.info(
                "downloading %s (revision %s): %d files, %s, into %s",
                repo,
                listing.revision[:12],
                len(listing.files),
                human_bytes(listing.size),
                cache,
            )
            started = time.monotonic()
            patterns = [glob_literal(name) for name in listing.files]
            with Progress(repo, folder, listing.size, share.report_every_s, on_progress):
                # At the commit listed: huggingface_hub asks for no other, and writes no ref (done below, once checked).
                snapshot_download(
                    repo,
                    revision=listing.revision,
                    allow_patterns=patterns,
                    cache_dir=cache,
                    max_workers=share.files_at_once,
                )
        except WeightsError:
            raise
        except (RepositoryNotFoundError, GatedRepoError) as error:
            raise WeightsError(
                f"the Hub has no model repo {repo} that HF_TOKEN may read "
                f"(check {setting}, the token, and the model's terms): {type(error).__name__}"
            ) from None
        except Exception as error:  # HTTP, network, disk and Xet errors alike: one line, and resumed next time
            raise WeightsError(
                f"downloading {repo} failed: {one_line(error)}; the next start takes it up again"
            ) from None
        seconds = time.monotonic() - started
        refuse_wrong_sizes(repo, folder, listing)
        write_atomically(folder / "refs" / "main", listing.revision)  # what vLLM's offline start resolves `main` by
        (folder / COMPLETE).write_text(json.dumps({"revision": listing.revision, "files": list(listing.files)}) + "\n")
    log.info(
        "downloaded %s: %s in %.1f s (%s/s)",
        repo,
        human_bytes(listing.size),
        seconds,
        human_bytes(listing.size / max(seconds, 1e-3)),
    )
    return listing


@contextlib.contextmanager
def downloading(cache: Path, folder: Path) -> Iterator[None]:
    """Held while downloading into a repo's cache `folder`: a lock shared by every process that downloads it (a
    start or a swap, and the preload, may fetch one repo at once: huggingface_hub's per-file locks keep them apart).
    The partial files a stopped download left are removed only by a download that is alone, never from under one."""
    (cache / LOCKS).mkdir(parents=True, exist_ok=True)
    with (cache / LOCKS / f"{folder.name}.vllm-pod-download.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another process downloads this repo: its `.incomplete` files are its own
        else:
            drop_partial_files(folder)
        fcntl.flock(lock, fcntl.LOCK_SH)  # from exclusive, a downgrade; the kernel drops it when the process dies
        yield


def refuse_wrong_sizes(repo: str, folder: Path, listing: Listing) -> None:
    """WeightsError when a file on disk is not the size the Hub listed (truncated, or not the file listed), after
    removing it, blob and all: huggingface_hub checks what was served only against the serving answer's headers,
    so a file listed at 1000 TB and served as 300 MiB would be kept, and marked complete."""
    snapshot = folder / "snapshots" / listing.revision
    wrong = {
        name: served for name, listed in listing.sizes.items() if (served := size_on_disk(snapshot / name)) != listed
    }
    for name in wrong:
        drop_file(folder, snapshot / name)
    if wrong:
        name, served = next(iter(wrong.items()))
        listed, more = exact_bytes(listing.sizes[name]), f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise WeightsError(
            f"downloading {repo}: {name} is listed at {listed} but {exact_bytes(served)} were "
            f"served{more}: removed, the next start downloads it again"
        )


def size_on_disk(path: Path) -> int:
    """A snapshot file's size (its blob's); 0 when absent, as when the Hub answered another commit for it."""
    return path.stat().st_size if path.is_file() else 0


def drop_file(folder: Path, pointer: Path) -> None:
    """Remove a snapshot's file and the blob it points to (only one inside the repo's `blobs`)."""
    blob = pointer.resolve()
    pointer.unlink(missing_ok=True)
    if blob.is_relative_to((folder / "blobs").resolve()):
        blob.unlink(missing_ok=True)


def exact_bytes(count: int) -> str:
    return f"{human_bytes(count)} ({count} bytes)"


def drop_partial_files(folder: Path) -> None:
    """Remove the temporary files a stopped download left: huggingface_hub never reuses them (each attempt
    writes its own), and on a volume they would pile up at a shard's size each."""
    partial = list((folder / "blobs").glob("*.incomplete"))
    if partial:
        size = sum(path.stat().st_size for path in partial)
        for path in partial:
            path.unlink(missing_ok=True)
        log.info(
            "removed %d partial file%s a stopped download left (%s); finished files are kept",
            len(partial),
            "" if len(partial) == 1 else "s",
            human_bytes(size),
        )


def list_repo(repo: str) -> Listing:
    """The files vLLM reads from `repo` (not the originals or other formats beside safetensors), with sizes;
    WeightsError, before anything is written, when the Hub's revision is not a commit id (see settings.COMMIT_ID)."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo, files_metadata=True)
    if not is_commit_id(info.sha):
        raise WeightsError(
            f"the Hub answered {repo}'s revision as {ascii(info.sha)[:100]}, not a 40-hex commit id: "
            "nothing was downloaded (check HF_ENDPOINT)"
        )
    siblings = info.siblings or []
    has_safetensors = any(s.rfilename.endswith(".safetensors") for s in siblings)
    kept = [s for s in siblings if not (has_safetensors and SKIPPED_WITH_SAFETENSORS.search(s.rfilename))]
    sizes = {s.rfilename: s.size for s in kept if s.size is not None}
    return Listing(info.sha, tuple(s.rfilename for s in kept), sum(sizes.values()), sizes)


def glob_literal(name: str) -> str:
    """A file name as an fnmatch pattern that matches only itself (`[` opens a character class)."""
    return re.sub(r"([\[\]*?])", r"[\1]", name)


class Progress:
    """A thread that measures a download's progress every REPORT_EVERY_S, bytes in the repo's cache folder (finished
    blobs and `.incomplete` ones) against the total, for `on_progress`, and logs it with the rate and the time left
    at most every `log_every_s`."""

    def __init__(
        self,
        repo: str,
        folder: Path,
        total: int,
        log_every_s: float = REPORT_EVERY_S,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.repo, self.folder, self.total = repo, folder, total
        self.log_every_s, self.on_progress = log_every_s, on_progress
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.report, name="weights-progress", daemon=True)

    def __enter__(self) -> Progress:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def on_disk(self) -> int:
        blobs = self.folder / "blobs"
        return sum(path.stat().st_size for path in blobs.iterdir()) if blobs.is_dir() else 0

    def report(self) -> None:
        start_bytes, started = self.on_disk(), time.monotonic()
        logged = started
        while not self.stop.wait(REPORT_EVERY_S):
            done, now = self.on_disk(), time.monotonic()
            if self.on_progress is not None:
                self.on_progress(done, self.total)
            if now - logged < self.log_every_s:
                continue
            logged = now
            rate = (done - start_bytes) / (now - started)
            left = f", about {human_seconds((self.total - done) / rate)} left" if rate > 0 and done < self.total else ""
            share = f" ({100 * done / self.total:.0f}%)" if self.total else ""
            log.info(
                "downloading %s: %s of %s%s, %s/s%s",
                self.repo,
                human_bytes(done),
                human_bytes(self.total),
                share,
                human_bytes(rate),
                left,
            )


def human_seconds(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Reads the VL_* variables (VL_MODEL, VL_REPO, VL_CACHE_DIR…) and HF_TOKEN, like `python -m runtime "
        "start`: run it on a pod's volume before the first start, or to resume a download."
    )


def run(args: argparse.Namespace) -> int:
    from runtime.engine.command import engine_command
    from runtime.engine.volume import hub_cache, make_cache_dirs
    from runtime.settings import SettingsError, load_settings

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        command = engine_command(load_settings(os.environ))
        if not command.hub_repos:
            print(f"nothing to download: {command.argv[4]} is a directory on this machine", file=sys.stderr)
            return 0
        make_cache_dirs(command.cache)
        ensure_weights(command.hub_repos, hub_cache(command.cache))
    except (SettingsError, WeightsError) as error:
        print(error, file=sys.stderr)
        return 2
    return 0
