"""The model swap's pieces without an engine: VL_SWAP's refusals, the two files the pod and the bridge share,
and the bridge's side (which request waits, one ask for many requests, a failed or slow swap's answer)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from runtime import swap
from runtime.bridge import swaps as swaps_module
from runtime.bridge.errors import BridgeError
from runtime.bridge.models import Catalog
from runtime.bridge.swaps import Swaps
from runtime.settings import SettingsError, load_settings
from runtime.start import check_swap
from runtime.swap import REQUEST_FILE, SwapState, asked, read_state, swap_table, write_state

LISTING = json.dumps({"data": [{"id": "tiny", "max_model_len": 65536}, {"id": "claude-tiny"}]}).encode()


def test_swap_pairs_read_as_a_table_and_bad_ones_are_refused_in_one_line() -> None:
    settings = load_settings({"VL_SWAP": "tiny:tiny, other:model:tiny2"})
    assert swap_table(settings.swap) == {"tiny": "tiny", "other:model": "tiny2"}  # split at the last colon
    for bad in ("tiny:nope", "tiny", "a:tiny a:tiny2", "-x:tiny"):
        with pytest.raises(SettingsError) as refused:
            load_settings({"VL_SWAP": bad})
        assert str(refused.value).startswith("VL_SWAP=") and "\n" not in str(refused.value)


def test_a_swap_is_refused_on_a_pod_of_several_engines_or_without_the_bridge() -> None:
    settings = load_settings({"VL_SWAP": "tiny:tiny tiny2:tiny2"})
    check_swap(settings, 1)
    with pytest.raises(SettingsError, match=r"VL_SWAP=.* empty on a pod of 2 engines"):
        check_swap(settings, 2)
    with pytest.raises(SettingsError, match=r"^VL_SWAP='tiny:tiny' is not allowed: expected empty with VL_BRIDGE=off"):
        load_settings({"VL_SWAP": "tiny:tiny", "VL_BRIDGE": "off"})  # `runtime settings` says it too


def test_the_state_file_reads_back_and_a_broken_one_reads_as_none(tmp_path: Path) -> None:
    assert read_state(tmp_path) is None
    state = SwapState(loaded="tiny", recipe_names={"tiny": ["tiny", "claude-tiny"]}, windows={"tiny2": 4096})
    write_state(tmp_path, state)
    assert read_state(tmp_path) == state
    (tmp_path / "swap.state.json").write_text("{not json")
    assert read_state(tmp_path) is None


def swaps_on(tmp_path: Path, state: SwapState) -> Swaps:
    catalog = Catalog()
    catalog.learn(LISTING)
    swaps = Swaps(("tiny:tiny", "tiny2:tiny2"), tmp_path, catalog, upstream=None)  # type: ignore[arg-type]
    catalog.others = swaps.others
    write_state(tmp_path, state)
    return swaps


def test_only_a_request_for_an_unloaded_recipe_waits_and_the_listing_names_it(tmp_path: Path) -> None:
    swaps = swaps_on(
        tmp_path, SwapState(loaded="tiny", recipe_names={"tiny": ["tiny", "claude-tiny"]}, windows={"tiny2": 4096})
    )
    assert not swaps.must_wait("tiny") and not swaps.must_wait("claude-sonnet-4-5")  # no VL_SWAP name: the loaded one
    assert swaps.must_wait("tiny2")
    assert "tiny2" in swaps.catalog.names() and swaps.catalog.anthropic_info("tiny2")["max_input_tokens"] == 4096
    write_state(tmp_path, SwapState(loaded="tiny", recipe_names={"tiny": ["tiny"]}, phase="starting", target="tiny2"))
    assert swaps.must_wait("tiny")  # the engine is down for the swap: every request waits


def test_many_waiting_requests_ask_once_and_an_unstreamed_one_gets_a_529_to_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    swaps = swaps_on(tmp_path, SwapState(loaded="tiny", recipe_names={"tiny": ["tiny", "claude-tiny"]}))
    asks: list[str] = []

    def ask_and_count(state_dir: Path, recipe: str) -> None:
        asks.append(recipe)
        swap.ask_for(state_dir, recipe)

    monkeypatch.setattr(swaps_module, "ask_for", ask_and_count)  # the real write, counted

    async def three_requests() -> list[BaseException | None]:
        return await asyncio.gather(*(swaps.ready_for("tiny2", 0.5) for _ in range(3)), return_exceptions=True)

    outcomes = asyncio.run(three_requests())
    assert asks == ["tiny2"] and asked(tmp_path) == "tiny2"
    assert json.loads((tmp_path / REQUEST_FILE).read_text())["recipe"] == "tiny2"
    for outcome in outcomes:
        assert isinstance(outcome, BridgeError) and outcome.status == 529
        assert outcome.headers()["retry-after"] == "30" and "tiny2 is being loaded" in outcome.message


def test_a_failed_swap_is_the_waiting_requests_error(tmp_path: Path) -> None:
    failed = {"recipe": "tiny2", "reason": "no such checkpoint", "at": time.time() + 1}
    swaps = swaps_on(tmp_path, SwapState(loaded="tiny", recipe_names={"tiny": ["tiny"]}, failed=failed))
    with pytest.raises(BridgeError, match="tiny2 could not be loaded: no such checkpoint"):
        asyncio.run(swaps.ready_for("tiny2"))
