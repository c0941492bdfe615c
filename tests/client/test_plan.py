"""`runtime plan`: the KV cache a card leaves a model, against every KV figure the field notes measured (within
5 %); the notes' refusals (a 24 GB card for Nemotron's 1M window and two sessions, Flash-Next on 80 GB, 17 GiB of
fixed KV under two prefills); a token's KV from a config's shape; a Hub repository sized from its files on the test
Hub; and RunPod's catalogue (its prices) through the stand-in."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest

from runtime.cli import main
from runtime.engine.recipes import load_recipe
from runtime.sizing.cards import BY_ID, CARDS, DEFAULT_GPUS, GIB, IMAGES
from runtime.sizing.choice import template_model
from runtime.sizing.fit import fit
from runtime.sizing.model import model_of_recipe, sizing_settings
from runtime.sizing.repo import kv_bytes
from space.targets import load_targets, unique_targets
from tests.support.hub_server import HubServer
from tests.support.repo_copy import ROOT
from tests.support.runpod_server import RunPodServer

ADA, PRO, A100, A40, RTX4090 = (
    "NVIDIA RTX 6000 Ada Generation",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "NVIDIA A100 80GB PCIe",
    "NVIDIA A40",
    "NVIDIA GeForce RTX 4090",
)
# (recipe, card, the pod's settings where they differ from the recipe, the notes' KV tokens, where the notes say it)
MEASURED = [
    ("nemotron", ADA, {}, 5_108_531, "23/08, align mode, 0.85"),
    ("nemotron", A100, {}, 18_500_000, "23/08, the machine table: 18.5 M of KV"),
    ("flashnext", PRO, {"VL_UTIL": "0.88"}, 309_594, "26/08: 0.88 caps the KV"),
    ("flashnext", PRO, {"VL_UTIL": "0.93"}, 504_841, "26/08: 0.93"),
    ("flashnext", PRO, {"VL_KVBYTES": "16106127360"}, 617_633, "26/08: --kv-cache-memory-bytes 15 GiB"),
    ("flashnext", PRO, {}, 596_630, "27/08: 14.5 GiB, the margin for the image encoder (the recipe's)"),
    ("ornithnvfp4", ADA, {}, 2_103_356, "NVFP4 weights 21.94 GiB, fp8 KV, 0.93"),
    ("ornith", A40, {}, 2_840_000, "two A40s at 0.93, bf16 KV: 2.84 M"),
    ("ornith", ADA, {"VL_TP": "1"}, 957_122, "23/08: one RTX 6000 Ada, 786 k of context (KV 957,122 tokens)"),
]


@pytest.mark.parametrize(
    ("recipe", "card", "changed", "tokens", "said"), MEASURED, ids=[f"{m[0]}-{m[4]}" for m in MEASURED]
)
def test_the_kv_the_notes_measured_is_planned_within_5_percent(recipe, card, changed, tokens, said) -> None:
    """The notes' settings reach `plan` as they reach a pod: VL_UTIL, VL_KVBYTES and VL_TP through the engine's own
    tuning (a fixed KV size gives way to VL_UTIL, as on the pod)."""
    model = model_of_recipe(load_recipe(recipe), environ={}, settings=sizing_settings(changed))
    planned = fit(model, BY_ID[card], sessions=1).kv_tokens
    assert planned is not None and abs(planned - tokens) / tokens < 0.05, (planned, tokens, said)


def test_nemotron_at_its_window_for_two_sessions_is_refused_on_24_gb_and_fits_48_gb(capsys) -> None:
    assert main(["plan", "--json", "--gpu", RTX4090, "--gpu", ADA]) == 0
    rows = {row["gpu"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows[RTX4090]["fits"] is False and "more than 0.85 of RTX 4090's 24.0 GiB" in rows[RTX4090]["why"]
    assert rows[ADA]["fits"] is True and rows[ADA]["kv_tokens"] >= 2 * 1_048_576 and rows[ADA]["image"] == "sm89"
    assert set(rows[ADA]) >= {"gpu", "memory_gb", "fits", "why", "max_context", "kv_tokens", "price_per_hour", "image"}
    assert rows[ADA]["price_per_hour"] is None  # no RUNPOD_API_KEY: the built-in table, unpriced
    assert rows[ADA]["measured"] == "209.9 tok/s solo, 648 at 8 sessions"


def test_flashnext_is_refused_on_80_gb_and_fits_96_gb_with_its_host_ram_said(capsys) -> None:
    assert main(["plan", "--model", "flashnext", "--gpu", A100, "--gpu", PRO]) == 0
    verdict, _, *table = capsys.readouterr().out.splitlines()
    assert verdict == (
        "flashnext at 262,144 tokens for 2 sessions: smallest card that fits: RTX PRO 6000 (image sm120); "
        "the host needs 110 GB of RAM besides"
    )
    a100 = next(line for line in table if line.startswith("A100"))
    assert " no " in a100 and "GiB of fixed KV" in a100


def test_two_prefills_refuse_17_gib_of_fixed_kv_where_15_gib_held() -> None:
    """The notes, 26/08: at 17 GiB one full-window request passed and two killed the engine; 15 GiB held both."""
    model = model_of_recipe(load_recipe("flashnext"), environ={})
    assert not fit(dataclasses.replace(model, kv_fixed_bytes=17 * GIB), BY_ID[PRO]).fits
    assert fit(dataclasses.replace(model, kv_fixed_bytes=15 * GIB), BY_ID[PRO]).fits


def test_a_longer_context_than_the_card_holds_says_the_longest_it_does(capsys) -> None:
    assert main(["plan", "--model", "ornithnvfp4", "--json", "--gpu", "NVIDIA L40S", "--sessions", "2"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["fits"] is False and row["max_context"] < 1_048_576 <= row["kv_tokens"] < 2 * 1_048_576
    assert f"the longest context for 2: {row['max_context']:,}" in row["why"]
    # VL_KV_OFFLOAD: host RAM for the rest of the two sessions' prefixes (fp8: 10,240 bytes a token)
    assert row["kv_offload_gib"] == math.ceil((2 * 1_048_576 - row["kv_tokens"]) * 10_240 / GIB)
    assert f"VL_KV_OFFLOAD={row['kv_offload_gib']} would keep the rest" in row["why"]


@pytest.mark.parametrize(
    ("config", "dtype_bytes", "expected"),
    [
        # Qwen3-Coder-30B-A3B: every layer, GQA
        ({"num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128}, 2, 98_304),
        # Qwen3-Next: one layer in four is full attention
        ({"num_hidden_layers": 48, "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4}, 1, 12_288),
        # Nemotron-H: `*` marks the attention layers of the hybrid pattern
        (
            {"num_hidden_layers": 6, "num_key_value_heads": 2, "head_dim": 128, "hybrid_override_pattern": "M-M*M*"},
            1,
            1_024,
        ),
        # layer_types, with the head size from the hidden size
        (
            {
                "num_hidden_layers": 4,
                "num_attention_heads": 8,
                "hidden_size": 1024,
                "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
            },
            2,
            8_192,
        ),
        # MLA: one latent and its rotary part a layer, not K and V
        ({"num_hidden_layers": 2, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_attention_heads": 16}, 2, 2_304),
    ],
    ids=["gqa", "interval", "pattern", "layer-types", "mla"],
)
def test_a_token_s_kv_bytes_follow_the_model_s_shape(config, dtype_bytes, expected) -> None:
    assert kv_bytes(config, dtype_bytes)[0] == expected


@pytest.mark.slow
def test_a_hub_repository_is_sized_from_its_files_and_its_config(
    hub_server: HubServer, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    repo = f"{hub_server.owner}/hybrid-model"
    hub_server.create_repo(repo)
    shape = {"num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64,
             "full_attention_interval": 4, "max_position_embeddings": 131072}  # fmt: skip
    hub_server.put_file(repo, "config.json", json.dumps(shape))
    hub_server.put_file(repo, "model-00001-of-00002.safetensors", b"w" * 3 * 2**20)
    hub_server.put_file(repo, "model-00002-of-00002.safetensors", b"w" * 2**20)
    for name, value in hub_server.env().items():
        monkeypatch.setenv(name, value)
    assert main(["plan", "--model", repo, "--gpu", RTX4090]) == 0
    verdict, source, _, row = capsys.readouterr().out.splitlines()
    assert verdict.startswith(f"{repo} at 131,072 tokens for 2 sessions: smallest card that fits: RTX 4090")
    assert f"{repo}: 0.00 GiB of weights, KV 2 attention layers of 8, 4 KV heads of 64, 2-byte" in source
    tokens = int((0.92 * BY_ID[RTX4090].memory_gib - 4 * 2**20 / GIB - 2.6) * GIB / (2 * 4 * 64 * 2 * 2))
    assert f" {tokens:,} " in row
    assert main(["plan", "--model", f"{hub_server.owner}/no-such-model"]) == 1
    assert capsys.readouterr().err.startswith(f"plan: cannot read {hub_server.owner}/no-such-model on the Hub: ")


@pytest.mark.slow
def test_with_a_runpod_key_the_catalogue_prices_the_cards_and_the_cheapest_that_fits_wins(
    runpod_server: RunPodServer, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", runpod_server.api_key)
    monkeypatch.setenv("RUNPOD_API_URL", runpod_server.url)
    assert main(["plan"]) == 0
    verdict, source, _, *table = capsys.readouterr().out.splitlines()
    assert (
        verdict
        == "nemotron at 1,048,576 tokens for 2 sessions: cheapest card that fits: RTX 6000 Ada at $0.77/h (image sm89)"
    )
    assert "RunPod's catalogue" in source
    assert [line.split("  ")[0] for line in table] == [
        "RTX 6000 Ada",
        "L40S",
        "A100 PCIe 80 GB",
        "RTX PRO 6000",
        "RTX 4090",
    ]
    assert " sm80   sm80 " in table[2]  # an A100: the sm80 image serves it, and it is cheaper than the 96 GB card


def test_a_kv_dtype_set_for_the_pod_resizes_the_measured_kv_and_says_so() -> None:
    nemotron = load_recipe("nemotron")  # its facts were measured with an fp8 cache
    measured = model_of_recipe(nemotron, environ={})
    bf16 = model_of_recipe(nemotron, environ={}, settings=sizing_settings({"VL_KV": "auto"}))
    assert bf16.kv_bytes_per_token == 2 * measured.kv_bytes_per_token
    assert bf16.source.endswith("; KV scaled from fp8 to auto (VL_KV)")


def test_pod_up_sizes_a_template_s_model_with_its_settings_whatever_else_it_holds() -> None:
    """A template's other variables (a secret reference RunPod substitutes at start) never stop the sizing."""
    env = {"VL_MODEL": "ornith", "VL_TP": "1", "VL_CTX": "131072", "HF_TOKEN": "{{ RUNPOD_SECRET_hf }}"}
    model = template_model(env)
    assert model is not None and (model.name, model.gpus, model.context) == ("ornith", 1, 131_072)
    assert template_model({"VL_MODEL": "ornith", "VL_UTIL": "1.5"}) is None  # a bad value: no verdict is guessed


def test_a_bad_setting_in_the_shell_stops_plan_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("VL_UTIL", "2")
    assert main(["plan"]) == 1
    assert capsys.readouterr().err == "plan: VL_UTIL='2' is not allowed: expected a number in 0.05..0.99, or empty\n"


@pytest.mark.slow  # starts a Python process
def test_a_table_whose_reader_has_gone_ends_without_a_traceback() -> None:
    """`python -m runtime plan | head -1`: the reader closes the pipe; the command ends as a piped command does."""
    reader, writer = os.pipe()
    os.close(reader)  # the reader is gone before the first line: the first write finds the pipe closed
    try:
        result = subprocess.run([sys.executable, "-m", "runtime", "plan"], stdout=writer, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT, timeout=60)  # fmt: skip
    finally:
        os.close(writer)
    assert (result.returncode, result.stderr) == (141, "")


def test_the_client_knows_every_image_docker_targets_toml_builds_and_a_card_for_each() -> None:
    """`plan` and `pod up` name the images by architecture from their own table: it must be the build's."""
    built = [target.name for target in unique_targets(load_targets()) if target.kind == "gpu"]
    assert sorted(IMAGES) == sorted(built) == sorted(DEFAULT_GPUS)
    assert all(BY_ID[gpu].arch == arch for arch, gpus in DEFAULT_GPUS.items() for gpu in gpus)
    assert {card.image for card in CARDS} == set(IMAGES)


def test_plan_shows_the_prefix_tokens_kv_offload_auto_keeps_beyond_the_gpus_kv(capsys) -> None:
    """VL_KV_OFFLOAD=auto on RunPod's H100/H200/B200 (RAM taken at the low end of what RunPod gives, 125 GB a GPU):
    RAM less max(32 GiB, 25%), in tokens of the model's KV (qwen: bf16, 98,304 bytes a token)."""
    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    assert main(["plan", "--model", "qwen", "--gpu", h100, "--gpu", h200, "--gpu", ADA]) == 0
    *_, line = capsys.readouterr().out.splitlines()
    gib = math.floor(125e9 / GIB - 32)  # 84
    tokens = gib * GIB // 98_304
    assert line.startswith("VL_KV_OFFLOAD=auto (RunPod's RAM taken as 125 GB a GPU): H100 SXM: ")
    assert f"H100 SXM: {gib} GiB, {tokens:,} prefix tokens beyond the GPU's " in line
    assert f"H200: {gib} GiB, {tokens:,} prefix tokens beyond" in line and "RTX 6000 Ada" not in line  # RAM unknown
    assert main(["plan", "--model", "qwen", "--json", "--gpu", h200, "--gpu", ADA]) == 0
    rows = {row["gpu"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows[h200]["kv_offload_auto"] == {"gib": gib, "tokens": tokens} and rows[ADA]["kv_offload_auto"] is None
    assert main(["plan", "--gpu", h100]) == 0  # nemotron: a hybrid, where auto is off
    assert capsys.readouterr().out.splitlines()[-1].endswith(": off for nemotron, a hybrid (Mamba) model")
