"""`python build.py --push` as users run it, against the strict local Hub (the real huggingface_hub client).

What is uploaded (only the build context), the no-op second push, the Space's README, following a
build that does not end (timeout, Ctrl-C), and every refusal as one line without the token. The
real build of what was uploaded, by a real builder into a real registry, is in test_publish_image.py.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from space import BuildError
from space.context import DOCKERFILE, context_files
from space.targets import load_targets, render
from tests.support.hub_server import HubServer
from tests.support.hub_spaces import subdomain
from tests.support.repo_copy import ROOT, copy_repo, git_checkout
from tests.support.signals import ctrl_c_as_at_a_terminal

pytestmark = pytest.mark.slow  # build.py run as a process against the test Hub and the RunPod stand-in

SPACE = f"{HubServer.owner}/vllm-pod-cpu"
REGISTRY = "registry.example.test"  # only named in output: nothing is pulled in these tests


def build_py(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "build.py", *args], cwd=cwd, capture_output=True, text=True, env=user_env(env), timeout=300
    )


def user_env(extra: dict[str, str]) -> dict[str, str]:
    """The user's environment with no token of this machine: HF_HOME is the test's own."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGING"))}
    return {**env, "HF_HUB_DISABLE_TELEMETRY": "1", **extra}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return copy_repo(tmp_path / "repo")


@pytest.fixture
def hub(hub_server: HubServer, tmp_path: Path) -> dict[str, str]:
    """The environment that points build.py at the test Hub, as the owner with a write token."""
    return {**hub_server.env(), "HF_HOME": str(tmp_path / "hf-home")}


def push(repo: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return build_py("--arch", "cpu", "--push", "--space-registry", REGISTRY, *extra, cwd=repo, env=env)


def expect_one_line_refusal(result: subprocess.CompletedProcess[str], *secrets: str) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("build.py: "), result.stderr
    for secret in secrets:
        assert secret not in result.stdout + result.stderr
    return lines[0]


def expected_context(repo: Path) -> set[str]:
    """What the Dockerfile copies: runtime/ (no caches), the facts script, the certificates folder."""
    listed = subprocess.run(
        [
            "git",
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "runtime",
            "docker/certs",
            "docker/image_facts.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {path for path in listed if (repo / path).is_file()}


def test_push_uploads_the_build_context_and_nothing_else(
    repo: Path, hub: dict[str, str], hub_server: HubServer
) -> None:
    result = push(repo, hub, "--detach")

    assert result.returncode == 0, result.stderr
    files = hub_server.space_files(SPACE)
    assert set(files) == {".gitattributes", DOCKERFILE, "README.md"} | expected_context(repo)
    assert files[DOCKERFILE] == render(load_targets()["cpu"]).encode()
    assert not (repo / "build" / "Dockerfile.cpu").exists()  # the push sent its rendering: no file to read back
    assert "build.py: wrote" not in result.stdout
    assert not any("__pycache__" in path or path.startswith(("tests/", ".venv/")) for path in files)
    info = hub_server.space(SPACE)
    assert (info.sdk, info.private) == ("docker", True)
    front = yaml.safe_load(files["README.md"].decode().split("---")[1])
    assert (front["sdk"], front["app_port"]) == ("docker", 7860)
    assert f"{REGISTRY}/pod-owner-vllm-pod-cpu:latest" in result.stdout
    assert "not following the build (--detach)" in result.stdout


def test_a_second_push_of_the_same_tree_is_a_no_op_and_a_code_change_uploads_one_file(
    repo: Path, hub: dict[str, str], hub_server: HubServer
) -> None:
    assert push(repo, hub, "--detach").returncode == 0
    commits = len(hub_server.commits(SPACE, "space"))

    again = push(repo, hub, "--detach")

    assert again.returncode == 0, again.stderr
    assert f"build.py: {SPACE}: unchanged, nothing pushed" in again.stdout
    assert len(hub_server.commits(SPACE, "space")) == commits  # no commit, so no rebuild

    cli = repo / "runtime" / "cli.py"
    cli.write_text(cli.read_text() + "\n# a change to our code\n")
    changed = push(repo, hub, "--detach")

    assert changed.returncode == 0, changed.stderr
    size = len(cli.read_bytes()) / 1e3
    assert f"build.py: uploaded 1 file(s), {size:.1f} kB, removed 0" in changed.stdout
    assert hub_server.space_files(SPACE)["runtime/cli.py"] == cli.read_bytes()


def test_a_file_gone_from_the_context_is_removed_from_the_space(
    repo: Path, hub: dict[str, str], hub_server: HubServer
) -> None:
    (repo / "runtime" / "extra_module.py").write_text("X = 1\n")
    assert push(repo, hub, "--detach").returncode == 0
    (repo / "runtime" / "extra_module.py").unlink()

    result = push(repo, hub, "--detach")

    assert "removed 1" in result.stdout
    assert "runtime/extra_module.py" not in hub_server.space_files(SPACE)


def test_following_a_build_that_does_not_end_stops_at_the_timeout(
    repo: Path, hub: dict[str, str], hub_server: HubServer
) -> None:
    """No builder is attached: the Space stays BUILDING and its build log never closes."""
    result = push(repo, hub, "--timeout", "0.05")

    line = expect_one_line_refusal(result, hub_server.write_token)
    assert line == (
        f"build.py: {SPACE} is still BUILDING after 3 s; it keeps building: follow it at "
        f"{hub_server.endpoint}/spaces/{SPACE} or run the same --push again"
    )
    assert "BUILDING" in result.stdout

    again = push(repo, hub, "--timeout", "0.05")  # the same push: nothing to upload, the build followed on
    assert expect_one_line_refusal(again, hub_server.write_token) == line
    assert f"build.py: {SPACE} is still BUILDING: following its build" in again.stdout
    assert '"image"' not in again.stdout, "no template for an image that is not built yet"
    status = build_py("--arch", "cpu", "--status", "--space-registry", REGISTRY, cwd=repo, env=hub)
    assert status.stdout == (  # a first build: no image exists yet
        f"build.py: wrote build/Dockerfile.cpu\nbuild.py: {SPACE}: BUILDING; its image, "
        f"{REGISTRY}/pod-owner-vllm-pod-cpu:latest, is served once this build succeeds "
        f"({hub_server.endpoint}/spaces/{SPACE})\n"
    )


def test_ctrl_c_stops_following_and_leaves_the_space_building(
    repo: Path, hub: dict[str, str], hub_server: HubServer
) -> None:
    command = [sys.executable, "build.py", "--arch", "cpu", "--push", "--space-registry", REGISTRY]
    with subprocess.Popen(
        command,
        cwd=repo,
        env=user_env(hub),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_at_a_terminal,
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            if " BUILDING" in line:  # the progress line: the build is being followed
                break
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)

    assert process.returncode == 130
    assert f"build.py: stopped following; the Space keeps building: {hub_server.endpoint}/spaces/{SPACE}" in stderr
    assert "Traceback" not in stderr
    assert hub_server.space_stage(SPACE) == "BUILDING"


def test_without_a_token_push_says_where_to_get_one(repo: Path, hub: dict[str, str]) -> None:
    env = {key: value for key, value in hub.items() if key != "HF_TOKEN"}
    line = expect_one_line_refusal(push(repo, env))
    assert line.startswith("build.py: no Hugging Face token: set HF_TOKEN to a token with write access")
    assert "--registry REF" in line


def test_a_read_only_token_is_refused_before_anything_is_created(
    repo: Path, hub_server: HubServer, tmp_path: Path
) -> None:
    env = {**hub_server.env(hub_server.read_token), "HF_HOME": str(tmp_path / "hf")}
    line = expect_one_line_refusal(push(repo, env), hub_server.read_token)
    assert "HF_TOKEN is read-only" in line
    assert hub_server.commits(SPACE, "space") == []


def test_an_account_without_docker_spaces_is_pointed_to_registry(
    repo: Path, hub_server: HubServer, tmp_path: Path
) -> None:
    env = {**hub_server.env(hub_server.free_token), "HF_HOME": str(tmp_path / "hf")}
    line = expect_one_line_refusal(push(repo, env), hub_server.free_token)
    assert "HTTP 402" in line and "paid plan" in line and "--registry REF" in line


def test_a_space_made_with_another_sdk_is_refused(repo: Path, hub: dict[str, str], hub_server: HubServer) -> None:
    hub_server.create_space(SPACE, sdk="gradio")
    line = expect_one_line_refusal(push(repo, hub), hub_server.write_token)
    assert line == (
        f"build.py: {SPACE} is a gradio Space, not a Docker one: choose another name with --space OWNER/NAME"
    )


def test_an_unreachable_hub_is_one_line(repo: Path, hub: dict[str, str], hub_server: HubServer) -> None:
    with hub_server.outage("refuse"):
        line = expect_one_line_refusal(push(repo, hub), hub_server.write_token)
    assert "the Hub is unreachable" in line


def test_a_space_under_someone_elses_name_is_refused(repo: Path, hub: dict[str, str], hub_server: HubServer) -> None:
    line = expect_one_line_refusal(push(repo, hub, "--space", "stranger/vllm-pod"), hub_server.write_token)
    assert "HTTP 403" in line and "create the Space stranger/vllm-pod" in line


def printed_template(stdout: str) -> dict:
    """The JSON body build.py prints after 'RunPod template …:'."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("RunPod template ")) + 1
    end = lines.index("}", start)
    return json.loads("\n".join(lines[start : end + 1]))


def test_the_template_for_a_space_is_valid_for_runpod_and_names_the_image(runpod_openapi) -> None:
    result = build_py("--arch", "sm89", "--runpod-template", "--space", "acme/pods-ada", cwd=ROOT, env={})

    assert result.returncode == 0, result.stderr
    body = printed_template(result.stdout)
    assert runpod_openapi.errors("CreateTemplateRequest", body) == []
    assert body["image"] == "registry.hf.space/acme-pods-ada:latest"
    assert (body["ports"], body["allowedCudaVersions"]) == (["8080/http", "22/tcp"], ["13.0"])
    assert "registry credential (user: acme, password: a read token" in result.stdout


def runpod_env(runpod_server, hub: dict[str, str], hub_server: HubServer) -> dict[str, str]:
    return {**hub, "RUNPOD_API_KEY": runpod_server.api_key, "RUNPOD_API_URL": runpod_server.url,
            "HF_READ_TOKEN": hub_server.read_token}  # fmt: skip


def test_runpod_saves_the_template_and_the_private_images_credential(
    runpod_server, repo: Path, hub: dict[str, str], hub_server: HubServer
) -> None:
    env = runpod_env(runpod_server, hub, hub_server)
    for _ in range(2):  # the second run updates the same template and reuses the credential
        result = build_py("--arch", "sm89", "--runpod", "--space", "acme/pods-ada", cwd=repo, env=env)
        assert result.returncode == 0, result.stderr

    (template,) = runpod_server.templates
    assert template["image"] == "registry.hf.space/acme-pods-ada:latest"
    assert template["name"] == "vllm-pod sm89 acme/pods-ada"
    # The first pod publishes its boot log: the template names the repo, and --runpod made it (private).
    assert template["env"]["VL_LOG_REPO"] == f"datasets/{HubServer.owner}/vllm-pod-logs"
    assert hub_server.state.repos[("dataset", f"{HubServer.owner}/vllm-pod-logs")].private
    assert len(runpod_server.registries) == 1
    assert "RunPod: updated the template 'vllm-pod sm89 acme/pods-ada'" in result.stdout
    assert hub_server.read_token not in result.stdout + result.stderr
    assert "only tag the Hub serves for a Space" in result.stdout
    assert "add a container registry credential" not in result.stdout  # build.py has just saved it
    assert "run build.py with --runpod" not in result.stdout


def test_a_second_space_gets_its_own_template(
    runpod_server, repo: Path, hub: dict[str, str], hub_server: HubServer
) -> None:
    env = runpod_env(runpod_server, hub, hub_server)
    for space in ("acme/pods-ada", "acme/pods-ada-2"):
        result = build_py("--arch", "sm89", "--runpod", "--space", space, "--config-repo", "acme/pod-config",
                          cwd=repo, env=env)  # fmt: skip
        assert result.returncode == 0, result.stderr
    images = {t["name"]: t["image"] for t in runpod_server.templates}
    assert images == {
        "vllm-pod sm89 acme/pods-ada": "registry.hf.space/acme-pods-ada:latest",
        "vllm-pod sm89 acme/pods-ada-2": "registry.hf.space/acme-pods-ada-2:latest",
    }
    assert {t["env"]["VL_CONFIG_REPO"] for t in runpod_server.templates} == {"acme/pod-config"}


def test_runpod_refuses_a_write_token_as_the_registry_password(
    runpod_server, repo: Path, hub: dict[str, str], hub_server: HubServer
) -> None:
    env = {**runpod_env(runpod_server, hub, hub_server), "HF_READ_TOKEN": hub_server.write_token}
    line = expect_one_line_refusal(
        build_py("--arch", "sm89", "--runpod", "--space", "acme/x", cwd=repo, env=env), hub_server.write_token
    )
    assert line.startswith("build.py: HF_READ_TOKEN is a write token (the Hub says so)")
    assert runpod_server.templates == []


def test_runpod_refuses_to_send_the_write_token_as_a_registry_password(runpod_server, repo: Path) -> None:
    env = {"RUNPOD_API_KEY": runpod_server.api_key, "RUNPOD_API_URL": runpod_server.url, "HF_TOKEN": "hf_write"}
    line = expect_one_line_refusal(
        build_py("--arch", "sm89", "--runpod", "--space", "acme/x", cwd=repo, env=env), "hf_write"
    )
    assert "set HF_READ_TOKEN to a read token (not the write token)" in line
    assert runpod_server.templates == []


def test_an_existing_public_space_keeps_its_visibility_and_needs_no_credential(
    repo: Path, hub: dict[str, str], hub_server: HubServer
) -> None:
    hub_server.create_space(SPACE, sdk="docker", private=False)

    result = push(repo, hub, "--detach")

    assert result.returncode == 0, result.stderr
    assert hub_server.space(SPACE).private is False
    assert "registry credential" not in result.stdout and "The image is private" not in result.stdout


PLANTED = {  # what a working tree gathers: none of it belongs in a Space, nor so in an image
    "runtime/.env": "HF_TOKEN=hf_planted_dotenv_0123456789",
    "docker/certs/.env": "PASSWORD=planted",
    "docker/certs/id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\nplanted\n",
    "runtime/bridge/secrets.json": '{"key": "planted"}',
    "runtime/.DS_Store": "planted",
    "runtime/.start.py.swp": "planted",
    "runtime/vendored/.git/config": "[core]\n",  # a nested repository: once a traceback
}


def test_push_sends_only_what_git_tracks_and_never_reads_through_a_link_out(
    tmp_path: Path, hub: dict[str, str], hub_server: HubServer
) -> None:
    repo = git_checkout(tmp_path / "clone")
    for path, content in PLANTED.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(content)
    outside = tmp_path / "outside-token"
    outside.write_text("hf_planted_through_a_link_0123456789")
    (repo / "runtime" / "token").symlink_to(outside)

    result = push(repo, hub, "--detach")
    assert result.returncode == 0, result.stderr
    files = hub_server.space_files(SPACE)
    assert set(files) == {".gitattributes", DOCKERFILE, "README.md"} | expected_context(repo)
    assert not set(PLANTED) & set(files) and "runtime/token" not in files
    assert not [r for r in hub_server.received if r.carries("hf_planted") or r.carries("planted\n")]
    assert "build.py: runtime/.env is not tracked by git: left out of the image" in result.stdout
    assert "runtime/.DS_Store" not in result.stdout  # litter is not worth a line

    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.test"]
    subprocess.run([*git, "add", "-f", "runtime/.env"], cwd=repo, check=True)
    line = expect_one_line_refusal(push(repo, hub, "--detach"), "hf_planted")
    assert line.startswith("build.py: runtime/.env looks like a secret (its name): it is not uploaded")

    subprocess.run([*git, "rm", "-q", "--cached", "runtime/.env"], cwd=repo, check=True)
    subprocess.run([*git, "add", "runtime/token"], cwd=repo, check=True)
    line = expect_one_line_refusal(push(repo, hub, "--detach"), "hf_planted")
    assert line.startswith(f"build.py: runtime/token is a link out of the tree (to {outside})")


def test_certificates_in_their_folder_are_no_secret(tmp_path: Path) -> None:
    repo = git_checkout(tmp_path / "clone")
    (repo / "docker" / "certs" / "proxy.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (repo / "docker" / "certs" / "proxy.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    subprocess.run(["git", "add", "-f", "docker/certs"], cwd=repo, check=True)
    with pytest.raises(BuildError, match=r"^docker/certs/proxy\.pem looks like a secret"):
        context_files("FROM scratch", root=repo, warn=lambda line: None)
    (repo / "docker" / "certs" / "proxy.pem").unlink()
    subprocess.run(["git", "add", "-u"], cwd=repo, check=True)
    assert "docker/certs/proxy.crt" in context_files("FROM scratch", root=repo, warn=lambda line: None)


FAKE_TOKEN = "hf_" + "planted0content0token0abcdef"  # a token's shape, made here: no real token in the repo


def tracked(repo: Path, path: str, content: str) -> None:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(content)
    subprocess.run(["git", "add", "-f", path], cwd=repo, check=True)


@pytest.mark.parametrize(
    ("plant", "refusal"),
    [
        (lambda repo: tracked(repo, "runtime/.netrc", "machine git.example.invalid login me password planted\n"),
         r"^runtime/\.netrc looks like a secret \(its name\)"),
        (lambda repo: tracked(repo, "runtime/.git-credentials", "https://me:planted@git.example.invalid\n"),
         r"^runtime/\.git-credentials looks like a secret \(its name\)"),
        (lambda repo: tracked(repo, "runtime/Credentials", "[default]\nplanted\n"),
         r"^runtime/Credentials looks like a secret \(its name\)"),
        (lambda repo: tracked(repo, "runtime/notes.py", f"# set up\nHF = {FAKE_TOKEN!r}\n"),
         r"^runtime/notes\.py holds what looks like a Hugging Face token \(line 2\): it is not uploaded"),
        (lambda repo: tracked(repo, "docker/image_facts_extra.py", "-----BEGIN RSA PRIVATE KEY-----\nplanted\n"),
         None),  # .dockerignore keeps it out of the context: nothing to refuse
    ],
    ids=["netrc", "git-credentials", "credentials-any-case", "a-token-by-its-shape", "not-in-the-context"],
)  # fmt: skip
def test_credentials_are_refused_by_their_name_in_any_case_and_by_their_content(
    tmp_path: Path, plant: Callable[[Path], None], refusal: str | None
) -> None:
    repo = git_checkout(tmp_path / "clone")
    plant(repo)
    if refusal is None:
        context_files("FROM scratch", root=repo, warn=lambda line: None)
        return
    with pytest.raises(BuildError, match=refusal) as refused:
        context_files("FROM scratch", root=repo, warn=lambda line: None)
    assert "planted" not in str(refused.value)  # the file is named, never what it holds


# The 17 credential files an attacker tracked under runtime/ (issue 46): each is refused, by its name or what it holds.
SECRET_VALUE = "planted0secret0value"
B64_TOKEN = base64.b64encode(FAKE_TOKEN.encode()).decode()
CREDENTIAL_FILES = [
    (".env", f"HF_TOKEN={SECRET_VALUE}\n"),
    ("id_rsa", "planted\n"),
    ("server.key", "planted\n"),
    ("secrets.yaml", "planted: 1\n"),
    (".netrc", f"machine git.example.invalid login me password {SECRET_VALUE}\n"),
    (".git-credentials", f"https://me:{SECRET_VALUE}@git.example.invalid\n"),
    ("Credentials", f"[default]\n{SECRET_VALUE}\n"),
    ("notes.py", f"HF = {FAKE_TOKEN!r}\n"),
    (".npmrc", f"//registry.example.invalid/:_authToken={SECRET_VALUE}\n"),
    (".pypirc", f"[pypi]\nusername = me\npassword = {SECRET_VALUE}\n"),
    ("token", f"{SECRET_VALUE}\n"),
    ("kubeconfig", f"users:\n- name: me\n  user:\n    token: {SECRET_VALUE}\n"),
    (".docker/config.json", f'{{"auths": {{"r.example": {{"auth": "{SECRET_VALUE}"}}}}}}\n'),
    ("db.env.sh", f"export DB_PASSWORD={SECRET_VALUE}\n"),
    ("service.yaml", f"service:\n  api_key: {SECRET_VALUE}\n"),
    ("database.py", f'URL = "postgres://app:{SECRET_VALUE}@db.example:5432/app"\n'),
    ("hub.txt", f"{B64_TOKEN}\n"),
]
# What a credential's place holds when it stands for one: uploaded (a reference, a placeholder, code).
NOT_CREDENTIALS = [
    (".npmrc.example", "//registry.example.invalid/:_authToken=${NPM_TOKEN}\n"),
    ("settings.yaml", "password: <your password>\napi_key: ${API_KEY}\n"),
    ("auth.py", "password = settings.password\ntoken = secrets.token_urlsafe(32)\nsecret: bytes,\n"),
    ("run.sh", 'export DB_PASSWORD="$DB_PASSWORD"\ncurl https://example.test:443/x\n'),
]


@pytest.mark.parametrize(("name", "content"), CREDENTIAL_FILES, ids=[name for name, _ in CREDENTIAL_FILES])
def test_each_tracked_credential_file_is_refused(tmp_path: Path, name: str, content: str) -> None:
    repo = git_checkout(tmp_path / "clone")
    tracked(repo, f"runtime/{name}", content)
    with pytest.raises(
        BuildError, match=rf"^runtime/{re.escape(name)} (?:looks like a secret|holds what looks)"
    ) as refused:
        context_files("FROM scratch", root=repo, warn=lambda line: None)
    assert SECRET_VALUE not in str(refused.value) and FAKE_TOKEN not in str(refused.value)


def test_a_credential_s_place_that_holds_a_reference_or_code_is_uploaded(tmp_path: Path) -> None:
    repo = git_checkout(tmp_path / "clone")
    for name, content in NOT_CREDENTIALS:
        tracked(repo, f"runtime/{name}", content)
    files = context_files("FROM scratch", root=repo, warn=lambda line: None)
    assert {f"runtime/{name}" for name, _ in NOT_CREDENTIALS} <= set(files)


def test_no_link_into_git_s_files_nor_a_hard_link_goes_in(tmp_path: Path) -> None:
    """git's config can carry a token (a remote's URL); a hard link's other name can be anywhere."""
    repo = git_checkout(tmp_path / "clone")
    (repo / "runtime" / "config").symlink_to(repo / ".git" / "config")
    subprocess.run(["git", "add", "runtime/config"], cwd=repo, check=True)
    with pytest.raises(BuildError, match=r"^runtime/config is a link into git's own files \(\.git/config\)"):
        context_files("FROM scratch", root=repo, warn=lambda line: None)
    subprocess.run(["git", "rm", "-q", "--cached", "runtime/config"], cwd=repo, check=True)
    (repo / "runtime" / "config").unlink()
    outside = tmp_path / "outside.txt"
    outside.write_text("planted")
    os.link(outside, repo / "runtime" / "linked.txt")
    subprocess.run(["git", "add", "runtime/linked.txt"], cwd=repo, check=True)
    with pytest.raises(BuildError, match=r"^runtime/linked\.txt is a hard link \(2 names\): it is not uploaded"):
        context_files("FROM scratch", root=repo, warn=lambda line: None)


def test_outside_git_a_secret_s_name_in_capitals_is_refused_too(tmp_path: Path) -> None:
    repo = git_checkout(tmp_path / "archive")
    shutil.rmtree(repo / ".git")  # a downloaded archive: every file under the tree counts
    for name in (".ENV", "ID_RSA"):
        (repo / "runtime" / name).write_text("planted")
        with pytest.raises(BuildError, match=rf"^runtime/{re.escape(name)} looks like a secret \(its name\)"):
            context_files("FROM scratch", root=repo, warn=lambda line: None)
        (repo / "runtime" / name).unlink()


CERTIFICATE = "-----BEGIN CERTIFICATE-----\nMIIBproxyCA\n-----END CERTIFICATE-----\n"  # public, meant to travel


def test_ca_certificates_git_ignores_reach_the_space_and_the_push_says_so(
    tmp_path: Path, hub: dict[str, str], hub_server: HubServer
) -> None:
    repo = git_checkout(tmp_path / "clone")
    # Ignored by git, as docs/guide/publish.md says:
    (repo / "docker" / "certs" / "proxy.crt").write_text(CERTIFICATE)

    result = push(repo, hub, "--detach")

    assert result.returncode == 0, result.stderr
    assert hub_server.space_files(SPACE)["docker/certs/proxy.crt"] == CERTIFICATE.encode()
    assert "build.py: the image trusts docker/certs/proxy.crt: sent with the build context" in result.stdout


def test_a_private_key_among_the_certificates_is_refused(tmp_path: Path) -> None:
    repo = git_checkout(tmp_path / "clone")
    (repo / "docker" / "certs" / "proxy.crt").write_text(CERTIFICATE + "-----BEGIN PRIVATE KEY-----\nplanted\n")
    with pytest.raises(BuildError, match=r"^docker/certs/proxy\.crt holds a private key: it is not uploaded"):
        context_files("FROM scratch", root=repo, warn=lambda line: None)


REGISTRY_REF = f"{REGISTRY}/acme/vllm-pod"
REGISTRY_AUTH = {"REGISTRY_USER": "acme", "REGISTRY_READ_TOKEN": "packages_read_0123456789abcdef"}


def registry_template(runpod_server, repo: Path, *extra: str, env: dict[str, str] | None = None):
    """`build.py --runpod --registry REF` as a user runs it, no Hub token; the saved template's body."""
    runpod = {"RUNPOD_API_KEY": runpod_server.api_key, "RUNPOD_API_URL": runpod_server.url, **(env or {})}
    result = build_py("--arch", "sm89", "--runpod", "--registry", REGISTRY_REF, *extra, cwd=repo, env=runpod)
    assert result.returncode == 0, result.stderr
    (template,) = runpod_server.templates
    return result, template


def test_a_registry_image_gets_its_pull_credential_on_runpod(runpod_server, repo: Path) -> None:
    first, template = registry_template(runpod_server, repo)  # a public package: nothing to pull with
    assert template["registry"] is None
    assert f"RunPod: no registry credential named '{REGISTRY_REF}': pods pull the image anonymously" in first.stdout
    assert "REGISTRY_USER and REGISTRY_READ_TOKEN" in first.stdout

    second, template = registry_template(runpod_server, repo, env=REGISTRY_AUTH)
    (credential,) = runpod_server.registries
    assert (credential["name"], credential["username"]) == (REGISTRY_REF, "acme")
    assert credential["password"] == REGISTRY_AUTH["REGISTRY_READ_TOKEN"]
    assert template["registry"] == credential["id"]
    assert REGISTRY_AUTH["REGISTRY_READ_TOKEN"] not in second.stdout + second.stderr
    assert (
        "add a container registry credential" not in second.stdout and "run build.py with --runpod" not in second.stdout
    )

    third, template = registry_template(runpod_server, repo)  # later runs name the credential made once
    assert template["registry"] == credential["id"] and len(runpod_server.registries) == 1
    assert f"RunPod: the template pulls with the registry credential '{REGISTRY_REF}'" in third.stdout


def test_a_registry_template_printed_alone_says_what_credential_to_create(repo: Path) -> None:
    result = build_py("--arch", "sm89", "--runpod-template", "--registry", REGISTRY_REF, cwd=repo, env={})
    assert result.returncode == 0, result.stderr
    assert (
        f"If the image is private, RunPod pulls it with a container registry credential: create one named "
        f"'{REGISTRY_REF}'"
    ) in result.stdout


def test_half_a_registry_credential_is_refused_before_anything_is_made(runpod_server, repo: Path) -> None:
    env = {"RUNPOD_API_KEY": runpod_server.api_key, "RUNPOD_API_URL": runpod_server.url, "REGISTRY_USER": "acme"}
    line = expect_one_line_refusal(
        build_py("--arch", "sm89", "--runpod", "--registry", REGISTRY_REF, cwd=repo, env=env), runpod_server.api_key
    )
    assert line.startswith("build.py: REGISTRY_READ_TOKEN is not set")
    assert runpod_server.templates == [] and runpod_server.registries == []


def test_runpod_keeps_the_model_chosen_in_the_console_and_model_changes_it(runpod_server, repo: Path) -> None:
    _, template = registry_template(runpod_server, repo)
    assert template["env"]["VL_MODEL"] == "nemotron"
    runpod_server.edit_template(template["id"], env={**template["env"], "VL_MODEL": "qwen38"})  # in RunPod's console

    again, template = registry_template(runpod_server, repo)
    assert template["env"]["VL_MODEL"] == "qwen38"
    assert "kept the console's VL_MODEL (--model RECIPE sets VL_MODEL)" in again.stdout

    _, template = registry_template(runpod_server, repo, "--model", "kimi")
    assert template["env"]["VL_MODEL"] == "kimi"
    assert template["env"]["HF_TOKEN"] == "{{ RUNPOD_SECRET_HF_TOKEN }}"  # the rest as it was


LONG_SPACE = f"{HubServer.owner}/vllm-pod-cpu-with-a-name-so-long-that-the-hub-shortens-it"


def test_a_long_space_name_gets_the_image_name_the_hub_gives_it(
    repo: Path, hub: dict[str, str], hub_server: HubServer
) -> None:
    hosted = f"{REGISTRY}/{subdomain(LONG_SPACE)}:latest"  # what the Hub's runtime names: cut, a 7-hex suffix
    assert re.fullmatch(rf"{REGISTRY}/[a-z0-9-]+-[0-9a-f]{{7}}:latest", hosted)

    result = push(repo, hub, "--detach", "--space", LONG_SPACE)

    assert result.returncode == 0, result.stderr
    assert printed_template(result.stdout)["image"] == hosted
    assert hosted in hub_server.space_files(LONG_SPACE)["README.md"].decode()
    status = build_py(
        "--arch", "cpu", "--status", "--space", LONG_SPACE, "--space-registry", REGISTRY, cwd=repo, env=hub
    )
    assert hosted in status.stdout
    alone = build_py("--arch", "cpu", "--runpod-template", "--space", LONG_SPACE, "--space-registry", REGISTRY,
                     cwd=repo, env=hub)  # fmt: skip
    assert printed_template(alone.stdout)["image"] == hosted
    tokenless = build_py("--arch", "cpu", "--runpod-template", "--space", LONG_SPACE, cwd=repo, env={})
    line = expect_one_line_refusal(tokenless)
    assert line.startswith(f"build.py: the image name of the Space {LONG_SPACE} cannot be predicted")
