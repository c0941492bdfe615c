"""Issue 46 §2: `plan --model OWNER/NAME` against a hostile repository. Each number of its config.json is read as a
bounded whole number (one line naming the field and its value otherwise: no traceback, no negative size that "fits"
any card), the layers are counted by arithmetic (10^15 layers hung `range(layers)`), and a file size the Hub gives
is bounded as well."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from huggingface_hub.hf_api import RepoSibling

from runtime.sizing.errors import PlanError
from runtime.sizing.repo import MAX_LAYERS, kv_bytes, weight_sizes
from tests.support.environ import outer_environ
from tests.support.hub_server import HubServer
from tests.support.repo_copy import ROOT

SHAPE = {"num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128}

HOSTILE = [
    ({"num_hidden_layers": 10**15, "attn_layer_period": 2}, "num_hidden_layers is 1000000000000000: "),
    ({"num_hidden_layers": "48"}, "num_hidden_layers is '48': "),
    ({"num_hidden_layers": -48}, "num_hidden_layers is -48: "),
    ({"num_hidden_layers": True}, "num_hidden_layers is True: "),
    (SHAPE | {"head_dim": -128}, "head_dim is -128: "),
    (SHAPE | {"num_key_value_heads": 1.5}, "num_key_value_heads is 1.5: "),
    (SHAPE | {"num_attention_heads": [32], "head_dim": None}, "num_attention_heads is [32]: "),
    (SHAPE | {"full_attention_interval": "4"}, "full_attention_interval is '4': "),
    (SHAPE | {"attn_layer_period": -2}, "attn_layer_period is -2: "),
    (
        SHAPE | {"attn_layer_period": 4, "attn_layer_offset": 9},
        "attn_layer_offset is 9: expected a whole number in 0..3",
    ),
    (SHAPE | {"kv_lora_rank": {"a": 1}}, "kv_lora_rank is {'a': 1}: "),
    (SHAPE | {"hidden_size": 1e400, "head_dim": None}, "hidden_size is inf: "),
    (SHAPE | {"layer_types": ["full_attention"] * (MAX_LAYERS + 1)}, f"layer_types names {MAX_LAYERS + 1:,} layers"),
]


@pytest.mark.parametrize(
    ("config", "said"), HOSTILE, ids=[said.split(" ")[0] + str(i) for i, (_, said) in enumerate(HOSTILE)]
)
def test_a_hostile_config_is_refused_in_one_line_naming_the_field_and_its_value(config, said) -> None:
    with pytest.raises(PlanError) as refused:
        kv_bytes(config, 2)
    assert str(refused.value).startswith(said) and "\n" not in str(refused.value)


def test_the_layers_of_a_period_are_counted_by_arithmetic() -> None:
    """Jamba's period: the layers at its offset modulo it, as many as the loop over them counted."""
    for layers, period, offset in [(32, 8, 4), (MAX_LAYERS, 7, 3), (5, 8, 6), (1, 1, 0)]:
        config = SHAPE | {"num_hidden_layers": layers, "attn_layer_period": period, "attn_layer_offset": offset}
        attention = sum(1 for layer in range(layers) if layer % period == offset)
        expected = attention * 4 * 128 * 2 * 2 if attention else None
        assert kv_bytes(config, 2)[0] == expected


def test_a_negative_or_strange_file_size_from_the_hub_is_refused() -> None:
    assert weight_sizes([RepoSibling("a.safetensors", size=5), RepoSibling("b.json", size=-1)], ".safetensors") == [5]
    for size in (-(2**40), 2**60, "5"):
        with pytest.raises(PlanError, match=r"the Hub gives 'a.safetensors' a size of "):
            weight_sizes([RepoSibling("a.safetensors", size=size)], ".safetensors")


@pytest.mark.slow
def test_plan_of_a_hostile_hub_repository_ends_in_one_line(hub_server: HubServer) -> None:
    """As a user runs it: a config.json of 10^15 layers (it hung), one that is not a JSON object and one that names
    no window (each a traceback)."""
    environ = outer_environ("RUNPOD_") | hub_server.env()
    answers = {}
    shape_without_window = SHAPE | {"full_attention_interval": 0}
    cases = [
        ("layers", {"num_hidden_layers": 10**15, "attn_layer_period": 2}),
        ("list", [1, 2]),
        ("nowindow", shape_without_window),
    ]
    for name, config in cases:
        repo = f"{hub_server.owner}/{name}"
        hub_server.create_repo(repo)
        hub_server.put_file(repo, "config.json", json.dumps(config))
        hub_server.put_file(repo, "model.safetensors", b"w" * 1024)
        answers[name] = subprocess.run([sys.executable, "-m", "runtime", "plan", "--model", repo, "--gpu", "NVIDIA L40S"],
                                       cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)  # fmt: skip
    owner = hub_server.owner
    for done in answers.values():
        assert done.returncode == 1 and done.stdout == "" and done.stderr.count("\n") == 1, done
    assert (
        answers["layers"].stderr
        == (
            f"plan: {owner}/layers's config.json: num_hidden_layers is 1000000000000000: expected a whole number in "
            f"1..{MAX_LAYERS:,}; the built-in recipes are sized offline: --model "
        )
        + answers["layers"].stderr.split("--model ", 1)[1]
    )
    assert answers["list"].stderr.startswith(f"plan: {owner}/list's config.json is not a JSON object: [1, 2];")
    assert answers["nowindow"].stderr == (
        f"plan: {owner}/nowindow's config.json names no max_position_embeddings: give the window (--context N)\n"
    )
