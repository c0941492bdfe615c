"""Several engines in one pod, decided before anything starts: how many (VL_REPLICAS, `auto`), on which
GPUs or cores and ports, which combinations are refused in one line; the router's command and its
pinned version; the conversation key each request gives the router; each engine's metrics under one
`/metrics`. The pod that runs them is tests/pod/test_replicas.py's.
"""

from __future__ import annotations

import re
import stat
import sys
from pathlib import Path

import pytest

from runtime.bridge.affinity import ROUTING_KEYS, conversation, routing_headers, routing_key
from runtime.bridge.auth import ApiKeys
from runtime.bridge.enginemetrics import engine_view, merged_metrics
from runtime.bridge.state import Bridge
from runtime.engine.command import engine_command
from runtime.health import degradation
from runtime.packages import read_versions
from runtime.pod.engines import Plan
from runtime.pod.gateway import check_roles
from runtime.pod.hubside import PodHub
from runtime.pod.replicas import plan_replicas, tensor_parallel
from runtime.pod.router import RouterError, check_router, pinned_version, router_argv, router_url
from runtime.pod.start import Pod
from runtime.settings import SettingsError, load_settings
from runtime.state.enginehealth import pod_condition, read_engine_health, write_engine_health

BASE = {"VL_MODEL": "tiny"}


def plan(gpus: int, accelerator: str = "cuda", cores: tuple[int, ...] = (0, 1, 2, 3), **env: str):
    settings = load_settings(BASE | env)
    return plan_replicas(settings, engine_command(settings), accelerator, gpus, cores)


def option(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_one_engine_is_todays_pod() -> None:
    (only,) = plan(gpus=4)
    assert only.name == "engine" and option(only.command.argv, "--port") == "18081"
    assert "CUDA_VISIBLE_DEVICES" not in only.command.env


def test_each_engine_gets_its_own_gpus_and_port() -> None:
    replicas = plan(gpus=4, VL_REPLICAS="2", VL_TP="2")
    assert [r.name for r in replicas] == ["engine-0", "engine-1"]
    assert [option(r.command.argv, "--port") for r in replicas] == ["18081", "18082"]
    assert [r.command.env["CUDA_VISIBLE_DEVICES"] for r in replicas] == ["0,1", "2,3"]
    assert [r.command.base_url for r in replicas] == ["http://127.0.0.1:18081", "http://127.0.0.1:18082"]
    assert all(tensor_parallel(r.command) == 2 for r in replicas)


def test_on_a_cpu_each_engine_gets_its_share_of_the_cores() -> None:
    replicas = plan(gpus=0, accelerator="cpu", cores=(0, 1, 2, 3), VL_REPLICAS="2")
    assert [r.command.env["VLLM_CPU_OMP_THREADS_BIND"] for r in replicas] == ["0,1", "2,3"]


def test_auto_fills_the_gpus_at_vl_tp_each_and_is_one_engine_on_a_cpu() -> None:
    assert len(plan(gpus=8, VL_REPLICAS="auto", VL_TP="2")) == 4
    assert len(plan(gpus=1, VL_REPLICAS="auto")) == 1
    assert len(plan(gpus=0, accelerator="cpu", VL_REPLICAS="auto")) == 1


@pytest.mark.parametrize(
    ("env", "allowed"),
    [
        ({"VL_REPLICAS": "2", "VL_DP": "2"}, "1 while VL_DP is above 1"),
        ({"VL_REPLICAS": "2", "VL_BRIDGE": "off"}, "1 with VL_BRIDGE=off"),
        ({"VL_REPLICAS": "4", "VL_TP": "2"}, "at most 1 on this pod (2 GPUs, 2 per engine), or auto"),
        ({"VL_REPLICAS": "2", "VL_ENGINE_PORT": "18069"}, "free of VL_ROUTER_PORT"),
    ],
)
def test_combinations_that_cannot_work_are_refused_in_one_line(env: dict[str, str], allowed: str) -> None:
    with pytest.raises(SettingsError) as refusal:
        plan(gpus=2, **env)
    line = str(refusal.value)
    assert "\n" not in line and allowed in line and line.startswith(("VL_REPLICAS=", "VL_ENGINE_PORT="))


def test_the_router_is_smg_on_loopback_with_the_routing_policy(tmp_path: Path) -> None:
    settings = load_settings({"VL_VENV": str(tmp_path), "VL_ROUTER_PORT": "19000"})
    argv = router_argv(settings, ["http://127.0.0.1:18081", "http://127.0.0.1:18082"])
    assert argv[:2] == [str(tmp_path / "bin" / "smg"), "launch"]
    assert option(tuple(argv), "--host") == "127.0.0.1" and option(tuple(argv), "--port") == "19000"
    assert option(tuple(argv), "--prometheus-host") == "127.0.0.1"
    assert option(tuple(argv), "--policy") == "manual" and option(tuple(argv), "--assignment-mode") == "min_group"
    spread = router_argv(load_settings({"VL_ROUTING": "round-robin"}), ["http://127.0.0.1:1"])
    assert option(tuple(spread), "--policy") == "round_robin"


@pytest.mark.slow  # starts a Python process
def test_the_installed_router_is_the_pinned_one_and_another_is_refused(tmp_path: Path) -> None:
    settings = load_settings({"VL_VENV": sys.prefix, "VL_PREBAKED_MARKER": str(tmp_path / "none")})
    assert check_router(settings) == pinned_version(settings) == read_versions()["engine"]["smg"]  # the test venv
    image = tmp_path / "image_prebaked"
    image.write_text('{"versions": {"smg": "0.0.1"}}')  # what an image's build recorded wins over the table
    installed = re.escape(read_versions()["engine"]["smg"])
    with pytest.raises(RouterError, match=rf"is smg {installed}, this pod needs smg 0\.0\.1"):
        check_router(load_settings({"VL_VENV": sys.prefix, "VL_PREBAKED_MARKER": str(image)}))
    fake = tmp_path / "bin" / "smg"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho smg 0.0.1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(RouterError, match=rf"is smg 0\.0\.1, this pod needs smg {pinned_version(settings)}"):
        check_router(load_settings({"VL_VENV": str(tmp_path)}))
    with pytest.raises(RouterError, match="VL_REPLICAS needs the router"):
        check_router(load_settings({"VL_VENV": str(tmp_path / "none")}))


def test_a_subagent_has_its_own_key_and_nothing_sent_reaches_the_router_in_clear() -> None:
    session = {"x-claude-code-session-id": "5e551011-aaaa"}
    agent = session | {"x-claude-code-agent-id": "agent-7"}
    assert conversation(session, None, "k") == "session:5e551011-aaaa"
    assert conversation(agent, None, "k") == "session:5e551011-aaaa/agent:agent-7"
    keys = {routing_key(h, None, "k") for h in (session, agent)}
    assert len(keys) == 2 and all(len(key) == 32 and "5e551011" not in key for key in keys)
    assert routing_key(session, None, "k") != routing_key(session, None, "other")  # two keys: two conversations


def test_with_vllms_own_data_parallelism_each_conversation_keeps_one_rank() -> None:
    """VL_DP: the rank is the routing key's digest modulo the engines, so an agent's turns keep their prefix on one
    engine while conversations spread over all of them; one engine: no rank (vLLM's balancer has nothing to pick)."""
    sessions = [{"x-claude-code-session-id": f"s-{n}"} for n in range(64)]
    assert routing_headers(sessions[0], None, "k") == {"x-smg-routing-key": routing_key(sessions[0], None, "k")}
    for engines in (2, 3):
        ranks = [routing_headers(session, None, "k", engines)["x-data-parallel-rank"] for session in sessions]
        assert ranks == [routing_headers(session, None, "k", engines)["x-data-parallel-rank"] for session in sessions]
        assert sorted(set(ranks)) == [str(rank) for rank in range(engines)]


def test_two_keys_sending_one_session_id_are_two_conversations() -> None:
    """The key is in the routing key wherever the session id comes from (headers, agent, `metadata.user_id`)."""
    legacy = "user_ab12_account_0000-1111_session_9f8e7d6c-0001"
    assert routing_key({}, legacy, "alice") != routing_key({}, legacy, "bob")
    agent = {"x-claude-code-session-id": "s1", "x-claude-code-agent-id": "a1"}
    assert routing_key(agent, None, "alice") != routing_key(agent, None, "bob")


def test_the_router_is_never_given_more_than_routing_keys_conversations() -> None:
    """Each new session id was one more key the router kept (~0.37 KB, for hours): now one of ROUTING_KEYS."""
    keys = {routing_key({"x-claude-code-session-id": f"s-{n}"}, None, "k") for n in range(2 * ROUTING_KEYS)}
    assert all(len(key) == 32 and int(key, 16) < ROUTING_KEYS for key in keys)
    assert len(keys) > ROUTING_KEYS * 0.8  # spread over them: two conversations rarely share an engine


def test_without_the_headers_the_session_of_user_id_then_the_key_names_the_conversation() -> None:
    legacy = "user_ab12_account_0000-1111_session_9f8e7d6c-0001"
    modern = '{"device_id":"d","account_uuid":"a","session_id":"9f8e7d6c-0001"}'
    assert conversation({}, legacy, "k") == conversation({}, modern, "k") == "user-session:9f8e7d6c-0001"
    assert conversation({}, "someone", "alice") == conversation({}, None, "alice") == "key:alice"


def test_behind_a_gateway_its_conversation_key_names_the_conversation() -> None:
    routed = {"x-smg-routing-key": "0123abcd"}  # what the gateway's router passes on
    assert conversation(routed, "user_x_session_9f8e7d6c-0001", "gateway") == "routed:0123abcd"
    assert conversation(routed | {"x-claude-code-session-id": "s1"}, None, "k") == "session:s1"


METRICS = (
    "# HELP vllm:num_requests_running Requests running.\n# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}\n'
    "# HELP vllm:prefix_cache_queries_total Tokens queried.\n# TYPE vllm:prefix_cache_queries_total counter\n"
    'vllm:prefix_cache_queries_total{{engine="0",model_name="tiny"}} 100.0\n'
    "# HELP vllm:prefix_cache_hits_total Tokens hit.\n# TYPE vllm:prefix_cache_hits_total counter\n"  # as vLLM writes them
    'vllm:prefix_cache_hits_total{{engine="0",model_name="tiny"}} {hits}\n'
)


def test_each_engines_metrics_come_under_one_exposition_with_their_replica() -> None:
    first, second = (METRICS.format(running=r, hits=h).encode() for r, h in ((2.0, 90.0), (0.0, 10.0)))
    merged = merged_metrics([first, None, second]).decode()
    assert merged.count("# TYPE vllm:num_requests_running gauge") == 1
    assert 'vllm:num_requests_running{engine="0",model_name="tiny",replica="0"} 2.0' in merged
    assert 'vllm:prefix_cache_hits_total{engine="0",model_name="tiny",replica="2"} 10.0' in merged
    assert 'replica="1"' not in merged  # it did not answer
    assert merged_metrics([first]) == first  # one engine: passed on as it is
    assert engine_view((True, first)).prefix_hit_rate == 0.9


def test_the_engines_health_file_says_degraded_and_which(tmp_path: Path) -> None:
    assert read_engine_health(tmp_path) is None and pod_condition(None) == "ok"  # one engine: no file
    write_engine_health(tmp_path, {"engine-0": True, "engine-1": False})
    states = read_engine_health(tmp_path)
    assert states == {"engine-0": "healthy", "engine-1": "down"} and pod_condition(states) == "degraded"
    assert degradation(states) == "degraded: engine-1 down"  # what the image's HEALTHCHECK prints
    assert degradation({"engine-0": "healthy"}) == "" and degradation(None) == ""
    stopped = {"engine-1": "exited with code 1; not restarted after 1 failed start in a row: this host is sick"}
    assert pod_condition(states, stopped=stopped) == "degraded"  # engine-0 still serves
    assert pod_condition(None, stopped={"engine": "sick"}) == pod_condition(states, stopped=states) == "stopped"


@pytest.mark.parametrize(
    ("env", "refusal"),
    [
        ({"VL_ROLE": "gateway"}, "VL_WORKERS='' is not allowed: expected at least one pod's URL with VL_ROLE=gateway"),
        ({"VL_WORKERS": "http://10.0.0.2:8080"}, "expected empty unless VL_ROLE=gateway"),
        ({"VL_ROLE": "gateway", "VL_WORKERS": "http://10.0.0.2:8080", "VL_REPLICAS": "2"}, "1 with VL_ROLE=gateway"),
        ({"VL_ROLE": "gateway", "VL_WORKERS": "http://10.0.0.2:8080", "VL_BRIDGE": "off"}, "on with VL_ROLE=gateway"),
        ({"VL_WORKER_KEY": "sk-gateway-to-workers-0123456789", "VL_BRIDGE": "off"}, "on with VL_WORKER_KEY"),
    ],
)
def test_a_gateway_without_workers_or_workers_without_a_gateway_are_refused(env: dict[str, str], refusal: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(refusal)):
        check_roles(load_settings(env))
    check_roles(load_settings({"VL_ROLE": "gateway", "VL_WORKERS": "https://abc-8080.proxy.runpod.net/"}))
    check_roles(load_settings({"VL_ROLE": "gateway", "VL_WORKERS": "http://10.0.0.9:9000/abc-8080"}))  # by path


def test_a_worker_accepts_its_gateway_s_key_as_one_more_labelled_gateway(tmp_path: Path) -> None:
    team = {"VL_API_KEYS": "alice:sk-alice-0123456789abcdef", "VL_WORKER_KEY": "sk-gateway-to-workers-0123456789"}
    worker = load_settings(team | {"VL_STATE_DIR": str(tmp_path)})
    labels = [(caller.label, caller.admin, key) for caller, key in ApiKeys.for_pod(worker).keys]
    assert labels == [
        ("alice", True, b"sk-alice-0123456789abcdef"),
        ("gateway", False, b"sk-gateway-to-workers-0123456789"),
    ]
    gateway = load_settings(team | {"VL_ROLE": "gateway", "VL_WORKERS": "http://10.0.0.2:8080"})
    assert ApiKeys.for_pod(gateway).labels == {"alice"}  # a gateway presents that key, its clients do not


def test_a_gateways_bridge_has_its_pods_from_its_environment_never_its_command_line(tmp_path: Path) -> None:
    """`ps` and the bridge's log (which starts with its command) showed every worker's URL: a URL can carry a secret."""
    urls = ("https://pod1abc-8080.proxy.runpod.net", "https://pod2abc-8080.proxy.runpod.net")
    env = {"VL_ROLE": "gateway", "VL_WORKERS": ",".join(urls), "VL_WORKER_KEY": "sk-gateway-to-workers-0123456789",
           "VL_STATE_DIR": str(tmp_path)}  # fmt: skip
    settings = load_settings(env)
    spec = Pod(settings, env, PodHub()).children.bridge_spec()
    assert not [word for word in spec.argv if "pod1abc" in word or "pod2abc" in word]
    assert Bridge(router_url(settings), load_settings(spec.env or {})).upstream.engines == urls  # what it asks directly


def test_the_bridge_is_told_the_engines_data_parallel_ranks_even_from_a_hub_file(tmp_path: Path) -> None:
    """VL_DP is an engine setting a Hub file may set: the bridge's command line carries the one in force (the pod
    restarts the bridge when it changes), and the bridge pins conversations to that many ranks."""
    env = {"VL_STATE_DIR": str(tmp_path)}
    pod = Pod(load_settings(env | {"VL_DP": "2"}), env, PodHub())  # the settings in force, the environment without
    command = engine_command(pod.settings, environ=env)
    pod.engines.plan = Plan(pod.settings, command, plan_replicas(pod.settings, command, "cpu", 0))  # as prepared
    argv = list(pod.children.bridge_spec().argv)
    assert argv[argv.index("--data-parallel") + 1] == "2"


@pytest.mark.parametrize("workers", ["ftp://10.0.0.2", "http://user:secret@10.0.0.2", "http://10.0.0.2:99999",
                                     "http://a.example http://a.example/", "http://a.example/?q=1", "http://a.example/p#f"])  # fmt: skip
def test_worker_urls_are_http_urls_without_query_or_credentials(workers: str) -> None:
    with pytest.raises(SettingsError) as refusal:
        load_settings({"VL_WORKERS": workers})
    assert str(refusal.value).startswith("VL_WORKERS=")
