"""`python -m runtime logs POD_ID [--follow]`: print a pod's Hub log (`etat/<POD_ID>.log` in the log repo).

With `--follow`, it keeps polling (one HEAD request per check; the file is read only when it changed) and
prints only the lines that are new, until Ctrl-C. Anonymous for a public repo, `HF_TOKEN` for a private one.
Control sequences are stripped before anything is printed: whoever can write to the repo (or reach a
pod's log) must not reach the terminal (OSC 52 writes the clipboard, others retitle or rewrite the screen).
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import time

from huggingface_hub import HfApi, get_token
from huggingface_hub.errors import HfHubHTTPError, RemoteEntryNotFoundError, RepositoryNotFoundError

from runtime.hub.logpublish import LOG_FOLDER, log_path
from runtime.hub.repo import FileVersion, HubRepo, bound_hub_timeouts, pod_id
from runtime.logsafe import strip_controls

# build.py's VL_LOG_REPO when none is chosen (space/runpod_template.py's DEFAULT_LOG_REPO, which imports nothing of
# ours): the repo a user's pods publish to unless they said otherwise.
DEFAULT_LOG_REPO = "datasets/{user}/vllm-pod-logs"


class Waiting(Exception):
    """Something that may resolve by itself (no log yet, Hub unreachable): fatal once, retried when following."""


class Fatal(Exception):
    """Something waiting will not fix (a refused token, an unexpected answer)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pod_id", help="the pod's id (RUNPOD_POD_ID, or its hostname)")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing what is new, until Ctrl-C")
    parser.add_argument(
        "--repo",
        default=os.environ.get("VL_LOG_REPO") or None,
        help="the log repo, owner/name or datasets/owner/name (default: $VL_LOG_REPO, else build.py's "
        "datasets/<the HF_TOKEN's user>/vllm-pod-logs)",
    )
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between checks with --follow")


def run(args: argparse.Namespace) -> int:
    if not args.repo:
        try:
            args.repo = default_log_repo(os.environ.get("HF_ENDPOINT") or None)
        except Fatal as error:
            return fail(f"no log repo: pass --repo OWNER/NAME or set VL_LOG_REPO ({error})", 2)
    if args.interval <= 0:
        return fail(f"--interval {args.interval:g} is not allowed: expected a number of seconds > 0", 2)
    try:
        repo = HubRepo.parse(args.repo, endpoint=os.environ.get("HF_ENDPOINT") or None)
    except ValueError as error:
        return fail(str(error), 2)
    path = log_path(pod_id({"RUNPOD_POD_ID": args.pod_id}))
    try:
        if args.follow:
            follow(repo, path, args.interval)
        else:
            sys.stdout.write(read(repo, path)[1])
    except KeyboardInterrupt:
        return 0
    except (Waiting, Fatal) as error:
        return fail(str(error), 1)
    return 0


def default_log_repo(endpoint: str | None) -> str:
    """build.py's log repo for the user the Hub token names (HF_TOKEN, or a stored login); Fatal saying why
    there is none: no token, or one the Hub would not name."""
    if not get_token():
        raise Fatal(f"with HF_TOKEN set, the default is build.py's {DEFAULT_LOG_REPO.format(user='<your user>')}")
    bound_hub_timeouts()
    try:
        user = HfApi(endpoint=endpoint).whoami()["name"]
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "?"
        raise Fatal(f"the Hub did not say whose HF_TOKEN this is: it answered {status}") from None
    except Exception as error:  # network down, timeout, not a Hub at that address
        raise Fatal(f"the Hub could not say whose HF_TOKEN this is: {type(error).__name__}") from None
    return DEFAULT_LOG_REPO.format(user=user)


def read(repo: HubRepo, path: str, known: FileVersion | None = None) -> tuple[FileVersion, str]:
    """The log's version and text, control sequences stripped (empty text when it is still `known`), with
    Hub errors made plain."""
    try:
        version = repo.version(path)
        if known is not None and version.etag == known.etag:  # other pods' commits move the repo, not this file
            return version, ""
        return version, strip_controls(repo.read_text(path, version))
    except RemoteEntryNotFoundError:
        raise Waiting(no_log_yet(repo, path)) from None
    except RepositoryNotFoundError:
        raise Waiting(
            f"repo {repo} not found on {repo.api.endpoint} (if it is private, set HF_TOKEN; "
            "a pod creates it on its first publish)"
        ) from None
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "?"
        first = str(error).strip().splitlines()[0]
        if status == 401:
            raise Fatal(f"the Hub refused the token (HF_TOKEN): {first}") from None
        raise Fatal(f"the Hub answered {status}: {first}") from None
    except Exception as error:  # network down, timeout, not a Hub at that address
        raise Waiting(f"cannot reach the Hub at {repo.api.endpoint}: {type(error).__name__}: {error}") from None


def no_log_yet(repo: HubRepo, path: str) -> str:
    message = f"no log {path} in {repo} yet"
    try:
        pods = [p.removeprefix(f"{LOG_FOLDER}/").removesuffix(".log") for p in repo.list_files(LOG_FOLDER)]
    except Exception:  # the listing only adds a hint
        return message
    return f"{message} (pods with a log: {', '.join(pods)})" if pods else message


class LogFollower:
    """A pod's Hub log read one poll at a time, handing out only the lines that are new: what `--follow`
    prints, and what `runtime pod up` shows while its pod boots. `poll` raises Waiting or Fatal."""

    def __init__(self, repo: HubRepo, path: str) -> None:
        self.repo, self.path = repo, path
        self.version: FileVersion | None = None
        self.lines: list[str] = []

    def poll(self) -> list[str]:
        self.version, text = read(self.repo, self.path, self.version)
        if not text:
            return []
        current = text.splitlines()
        added, self.lines = new_lines(self.lines, current), current
        return added


def follow(repo: HubRepo, path: str, interval_s: float) -> None:
    """Prints the log, then each new line as it appears; says once on stderr why it is waiting."""
    log = LogFollower(repo, path)
    said = ""
    while True:
        try:
            for line in log.poll():
                print(line, flush=True)
            said = ""
        except Waiting as reason:
            if str(reason) != said:
                print(
                    strip_controls(f"runtime logs: {reason}; still trying (Ctrl-C to stop)"),
                    file=sys.stderr,
                    flush=True,
                )
                said = str(reason)
        time.sleep(interval_s)


def new_lines(before: list[str], after: list[str]) -> list[str]:
    """Lines of `after` that `before` did not have: the log is a window of tails, not an append-only file."""
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    added = [after[j1:j2] for tag, _, _, j1, j2 in matcher.get_opcodes() if tag in ("insert", "replace")]
    return [line for block in added for line in block]


def fail(message: str, code: int) -> int:
    print(strip_controls(f"runtime logs: {message}"), file=sys.stderr)  # a Hub's error text, too
    return code
