"""The RunPod template (space/runpod.py) against a strict stand-in for RunPod's REST API v2.

The stand-in (tests/support/runpod_server.py) checks every body against RunPod's published OpenAPI description,
vendored as tests/data/runpod-openapi-v2.json: repository `runpod/docs`, path `api-reference-v2/openapi.json`,
commit a900806e253c4f8c16da27d1a4370e72456da4cb (copied verbatim; refresh it from there, never edit it).
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx
import pytest

import runtime.runpod.api as runpod_client
from runtime.runpod.api import RunPodError
from runtime.runpod.clusters import cluster_body as spread_cluster
from runtime.settings import SettingsError, load_settings, recipe_names
from space import BuildError, runpod
from tests.support.net import free_port

pytestmark = pytest.mark.slow  # the RunPod stand-in checks every request against RunPod's OpenAPI file

if TYPE_CHECKING:
    from tests.support.runpod_server import OpenAPISchemas, RunPodServer

PUBLIC_IMAGE = "docker.io/someone/vllm-pod-sm89:latest"
PRIVATE_IMAGE = "registry.hf.space/pod-owner-vllm-pod-sm89:latest"
NAME = "vllm-pod-sm89"
REGISTRY_AUTH = ("pod-owner", "hf_registrypassword0123456789abcdef")


@pytest.fixture
def api_url(runpod_server: RunPodServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """Points the client at the stand-in the way a user would: RUNPOD_API_URL."""
    monkeypatch.setenv("RUNPOD_API_URL", runpod_server.url)
    return runpod_server.url


def one_line_without(error: BuildError, *secrets: str) -> str:
    line = str(error)
    assert line and "\n" not in line, line
    for secret in secrets:
        assert secret not in line
    return line


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never answers: a hung API."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


def writes(server: RunPodServer) -> list:
    return [r for r in server.received if r.method != "GET"]


def test_the_body_is_a_valid_create_and_update_request(runpod_openapi: OpenAPISchemas) -> None:
    body = runpod.template_body(NAME, PRIVATE_IMAGE, registry_id="6n2k8v4d")
    assert runpod_openapi.errors("CreateTemplateRequest", body) == []
    assert runpod_openapi.errors("UpdateTemplateRequest", body) == []
    assert runpod_openapi.errors("CreateTemplateRequest", runpod.template_body(NAME, PUBLIC_IMAGE)) == []
    assert runpod_openapi.errors("CreateTemplateRequest", {**body, "bogus": 1})  # the check itself can fail
    assert runpod_openapi.server_url == runpod_client.API_URL


def test_the_multi_node_design_is_a_valid_application_cluster_request(runpod_openapi: OpenAPISchemas) -> None:
    """An APPLICATION cluster: RunPod sets each node's variables and the image picks its role (no Ray in it)."""
    body = runpod.cluster_body("big-model", PUBLIC_IMAGE, "NVIDIA H100 80GB HBM3", gpus_per_node=8, nodes=2)
    assert runpod_openapi.errors("CreateClusterRequest", body) == []
    assert body["type"] == "APPLICATION" and "ray" not in json.dumps(body).lower()
    assert body["compute"] == {"gpuTypeId": "NVIDIA H100 80GB HBM3", "gpuCountPerPod": 8, "podCount": 2}
    assert (body["image"], body["ports"], body["env"]) == (
        PUBLIC_IMAGE, ["8080/http", "22/tcp"], runpod.template_body("big-model", PUBLIC_IMAGE)["env"]
    )  # fmt: skip
    assert runpod_openapi.errors("CreateClusterRequest", {**body, "registry": "6n2k8v4d"})  # public images only
    one_node = runpod.cluster_body("big-model", PUBLIC_IMAGE, "NVIDIA H100 80GB HBM3", gpus_per_node=8, nodes=1)
    assert runpod_openapi.errors("CreateClusterRequest", one_node)  # a cluster has two nodes at least


def test_a_private_image_s_template_makes_no_cluster() -> None:
    private = runpod.template_body(NAME, PRIVATE_IMAGE, registry_id="6n2k8v4d")
    compute = {"gpuTypeId": "NVIDIA H100 80GB HBM3", "gpuCountPerPod": 8, "podCount": 2}
    with pytest.raises(RunPodError, match="clusters take public images only"):
        spread_cluster(NAME, private, compute)


def test_the_template_offers_the_runtimes_recipes_and_default() -> None:
    assert runpod.recipe_names() == list(recipe_names())  # read from the files: the build side imports no settings
    assert (
        runpod.DEFAULT_MODEL == load_settings({}).model == runpod.template_body(NAME, PUBLIC_IMAGE)["env"]["VL_MODEL"]
    )


def test_the_pod_it_describes() -> None:
    body = runpod.template_body(NAME, PUBLIC_IMAGE)
    assert body["ports"] == ["8080/http", "22/tcp"]
    assert (body["startSsh"], body["startJupyter"], body["public"]) == (True, False, False)
    assert body["allowedCudaVersions"] == ["13.0"]
    assert body["mounts"]["persistent"]["path"] == "/workspace" and body["mounts"]["persistent"]["size"] >= 100
    env = body["env"]
    assert body["mounts"]["persistent"]["path"] == load_settings({}).volume  # where the runtime keeps its caches
    assert not {"HF_HOME", "HF_HUB_CACHE", "VLLM_CACHE_ROOT"} & set(env)  # the runtime sets them, on the volume
    assert env["HF_TOKEN"] == "{{ RUNPOD_SECRET_HF_TOKEN }}"
    assert env["VL_API_KEYS"] == "{{ RUNPOD_SECRET_VL_API_KEYS }}"
    assert "VL_LOG_REPO" not in env  # an empty value would outrank the Hub settings file


def test_the_printed_template_pastes_and_names_only_secrets() -> None:
    text = runpod.render_template(runpod.template_body(NAME, PRIVATE_IMAGE), private=True)
    body, _ = json.JSONDecoder().raw_decode(text[text.index("{") :])
    assert body == runpod.template_body(NAME, PRIVATE_IMAGE)
    assert "HF_TOKEN" in text and "VL_API_KEYS" in text and "registry.hf.space" in text
    assert "\n  HF_TOKEN: a Hugging Face token with WRITE access to the log repo" in text  # a read token: no log
    public = runpod.render_template(runpod.template_body(NAME, PUBLIC_IMAGE))
    assert "private" not in public[public.rindex("}") :]


def test_save_creates_then_updates_the_same_template(
    runpod_server: RunPodServer, api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    first = runpod.save_template(runpod.template_body(NAME, PUBLIC_IMAGE), runpod_server.api_key, None)
    second = runpod.save_template(
        runpod.template_body(NAME, PUBLIC_IMAGE.replace("latest", "v2")), runpod_server.api_key, None
    )

    assert first == second and len(runpod_server.templates) == 1
    assert runpod_server.templates[0]["image"].endswith(":v2")
    assert [(r.method, r.schema, r.status) for r in writes(runpod_server)] == [
        ("POST", "CreateTemplateRequest", 201),
        ("PATCH", "UpdateTemplateRequest", 200),
    ]
    out = capsys.readouterr().out
    assert f"created the template '{NAME}' ({first})" in out and f"updated the template '{NAME}' ({first})" in out
    assert not any(r.carries(runpod_server.api_key) for r in runpod_server.received)


def test_an_update_keeps_variables_added_in_the_console(
    runpod_server: RunPodServer, api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    template_id = runpod.save_template(runpod.template_body(NAME, PUBLIC_IMAGE), runpod_server.api_key, None)
    env = {**runpod_server.templates[0]["env"], "VL_LOG_REPO": "pod-owner/pod-logs", "VL_MODEL": "other"}
    runpod_server.edit_template(template_id, env=env)

    runpod.save_template(runpod.template_body(NAME, PUBLIC_IMAGE), runpod_server.api_key, None)

    saved = runpod_server.templates[0]["env"]
    assert saved["VL_LOG_REPO"] == "pod-owner/pod-logs" and saved["VL_MODEL"] == "other"  # the user's choice
    assert (
        "kept the variables added in the console: VL_LOG_REPO; kept the console's VL_MODEL" in capsys.readouterr().out
    )

    chosen = runpod.template_body(NAME, PUBLIC_IMAGE, model="qwen", log_repo="pod-owner/other-logs")
    runpod.save_template(chosen, runpod_server.api_key, None, owned={"VL_MODEL"})  # build.py --model qwen
    saved = runpod_server.templates[0]["env"]
    assert (saved["VL_MODEL"], saved["VL_LOG_REPO"]) == ("qwen", "pod-owner/pod-logs")


def test_a_private_image_gets_one_registry_credential(
    runpod_server: RunPodServer, api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    runpod.save_template(runpod.template_body(NAME, PRIVATE_IMAGE), runpod_server.api_key, REGISTRY_AUTH)
    runpod.save_template(runpod.template_body(NAME, PRIVATE_IMAGE), runpod_server.api_key, REGISTRY_AUTH)

    [registry] = runpod_server.registries
    assert (registry["username"], registry["password"]) == REGISTRY_AUTH
    assert registry["name"] == "registry.hf.space/pod-owner-vllm-pod-sm89"
    [template] = runpod_server.templates
    assert template["registry"] == registry["id"]
    out = capsys.readouterr().out
    assert "created the registry credential" in out and "reusing the registry credential" in out
    assert REGISTRY_AUTH[1] not in out


def test_a_public_image_clears_a_stale_registry_reference(runpod_server: RunPodServer, api_url: str) -> None:
    runpod.save_template(runpod.template_body(NAME, PRIVATE_IMAGE), runpod_server.api_key, REGISTRY_AUTH)
    runpod.save_template(runpod.template_body(NAME, PUBLIC_IMAGE), runpod_server.api_key, None)
    assert runpod_server.templates[0]["registry"] is None


def test_two_templates_of_that_name_are_not_guessed_between(runpod_server: RunPodServer, api_url: str) -> None:
    for _ in range(2):
        runpod_server.add_template({"name": NAME, "image": PUBLIC_IMAGE})
    with pytest.raises(BuildError, match="2 RunPod templates are named"):
        runpod.save_template(runpod.template_body(NAME, PUBLIC_IMAGE), runpod_server.api_key, None)
    assert writes(runpod_server) == []


def test_a_wrong_key_gives_one_line_without_it(runpod_server: RunPodServer, api_url: str) -> None:
    wrong = runpod_server.api_key[::-1]
    with pytest.raises(BuildError) as refused:
        runpod.save_template(runpod.template_body(NAME, PRIVATE_IMAGE), wrong, REGISTRY_AUTH)
    line = one_line_without(refused.value, wrong, runpod_server.api_key, REGISTRY_AUTH[1])
    assert line.startswith("RUNPOD_API_KEY was refused: Unauthorized")
    assert runpod_server.registries == [] and runpod_server.templates == []


def test_a_read_only_key_is_refused_on_the_first_write(runpod_server: RunPodServer, api_url: str) -> None:
    with pytest.raises(BuildError) as refused:
        runpod.save_template(runpod.template_body(NAME, PUBLIC_IMAGE), runpod_server.read_only_key, None)
    line = one_line_without(refused.value, runpod_server.read_only_key)
    assert line.startswith("RUNPOD_API_KEY was refused: Forbidden") and "create the template" in line


def test_the_stand_in_refuses_an_unknown_field(runpod_server: RunPodServer, api_url: str) -> None:
    body = {**runpod.template_body(NAME, PUBLIC_IMAGE), "volumeInGb": 200}  # a v1 name, gone in v2
    with runpod.RunPodAPI(runpod_server.api_key) as api, pytest.raises(BuildError) as refused:
        api.create_template(body)
    line = one_line_without(refused.value, runpod_server.api_key)
    assert "HTTP 422" in line and "volumeInGb" in line
    assert runpod_server.received[-1].status == 422 and runpod_server.templates == []


def test_the_stand_in_refuses_a_bad_value_and_an_unknown_id(runpod_server: RunPodServer, api_url: str) -> None:
    with runpod.RunPodAPI(runpod_server.api_key) as api:
        with pytest.raises(BuildError, match=r"\$\.env\.VL_TP"):
            wrong = {**runpod.template_body(NAME, PUBLIC_IMAGE), "env": {"VL_TP": 2}}  # what no TemplateBody holds
            api.call("POST", "/v2/templates", f"create the template {NAME!r}", wrong)
        with pytest.raises(BuildError, match="HTTP 404"):
            api.update_template("nosuchid", runpod.template_body(NAME, PUBLIC_IMAGE))
    assert [r.status for r in runpod_server.received] == [422, 404]


def test_an_unreachable_api_gives_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNPOD_API_URL", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(BuildError) as refused:
        runpod.save_template(runpod.template_body(NAME, PUBLIC_IMAGE), "rpa_not_sent_anywhere", None)
    assert "could not be reached" in one_line_without(refused.value, "rpa_not_sent_anywhere")


def test_a_silent_api_times_out_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with silent_port() as port:
        monkeypatch.setattr(runpod_client, "TIMEOUT", httpx.Timeout(0.5))
        with pytest.raises(BuildError) as refused:
            runpod.save_template(
                runpod.template_body(NAME, PUBLIC_IMAGE), "rpa_key", None, base_url=f"http://127.0.0.1:{port}"
            )
    assert "did not answer within 0.5 s" in one_line_without(refused.value, "rpa_key")


def test_an_empty_key_is_refused_before_any_request(runpod_server: RunPodServer) -> None:
    with pytest.raises(BuildError, match="RUNPOD_API_KEY is empty"):
        runpod.save_template(runpod.template_body(NAME, PUBLIC_IMAGE), " \n", None, base_url=runpod_server.url)
    assert runpod_server.received == []


def test_the_gpu_price_becomes_the_pods_cost_setting(
    runpod_server: RunPodServer, api_url: str, runpod_openapi: OpenAPISchemas
) -> None:
    body = runpod.template_body(NAME, PUBLIC_IMAGE, cost_per_hour=0.69)
    assert runpod_openapi.errors("CreateTemplateRequest", body) == []
    runpod.save_template(runpod.template_body(NAME, PUBLIC_IMAGE, cost_per_hour=0.69), runpod_server.api_key, None)
    saved = runpod_server.templates[0]["env"]["VL_COST_PER_HOUR"]
    assert load_settings({"VL_COST_PER_HOUR": saved}).cost_per_hour == 0.69  # as the pod reads it
    assert "VL_COST_PER_HOUR" not in runpod.template_body(NAME, PUBLIC_IMAGE)["env"]  # a template fits any GPU
    highest = runpod.COST_PER_HOUR_MAX  # the same bound as the setting's
    assert load_settings({"VL_COST_PER_HOUR": f"{highest:g}"}).cost_per_hour == highest
    with pytest.raises(SettingsError):
        load_settings({"VL_COST_PER_HOUR": f"{highest * 1.01:g}"})
    for refused in (0.0, runpod.COST_PER_HOUR_MAX * 1.01, float("nan")):
        with pytest.raises(BuildError, match="--cost-per-hour must be a price in dollars"):
            runpod.template_body(NAME, PUBLIC_IMAGE, cost_per_hour=refused)
