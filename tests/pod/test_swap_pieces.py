"""The model swap's pieces without an engine: VL_SWAP's refusals, the two files the pod and the bridge share,
and the bridge's side (which request waits, one ask for many requests, a failed or slow swap's answer)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from runtime.bridge import swaps as swaps_module
from runtime.bridge.auth import ApiKeys
from runtime.bridge.errors import BridgeError
from runtime.bridge.models import Catalog
from runtime.bridge.swaps import Swaps
from runtime.pod.engines import check_swap
from runtime.settings import SettingsError, load_settings
from runtime.state import statefile, swap
from runtime.state.swap import REQUEST_FILE, SwapState, asked, read_state, swap_table, write_state

KEYS = {"VL_API_KEYS": "owner:sk-owner-0123456789abcdef"}  # VL_SWAP takes keys: a stranger could stop the engine
LISTING = json.dumps({"data": [{"id": "tiny", "max_model_len": 65536}, {"id": "claude-tiny"}]}).encode()


def test_swap_pairs_read_as_a_table_and_bad_ones_are_refused_in_one_line() -> None:
    settings = load_settings({"VL_SWAP": "tiny:tiny, other:model:tiny2"} | KEYS)
    assert swap_table(settings.swap) == {"tiny": "tiny", "other:model": "tiny2"}  # split at the last colon
    for bad in ("tiny:nope", "tiny", "a:tiny a:tiny2", "-x:tiny"):
        with pytest.raises(SettingsError) as refused:
            load_settings({"VL_SWAP": bad})
        assert str(refused.value).startswith("VL_SWAP=") and "\n" not in str(refused.value)


def test_a_swap_is_refused_on_a_pod_of_several_engines_or_without_the_bridge() -> None:
    settings = load_settings({"VL_SWAP": "tiny:tiny tiny2:tiny2"} | KEYS)
    check_swap(settings, 1)
    with pytest.raises(SettingsError, match=r"VL_SWAP=.* empty on a pod of 2 engines"):
        check_swap(settings, 2)
    with pytest.raises(SettingsError, match=r"^VL_SWAP='tiny:tiny' is not allowed: expected empty with VL_BRIDGE=off"):
        load_settings({"VL_SWAP": "tiny:tiny", "VL_BRIDGE": "off"} | KEYS)  # `runtime settings` says it too


def test_a_swap_without_keys_is_refused_in_one_line_and_only_the_admin_and_swap_keys_may_swap() -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings({"VL_SWAP": "tiny:tiny tiny2:tiny2"})
    assert str(refused.value) == ("VL_SWAP='tiny:tiny,tiny2:tiny2' is not allowed: expected empty while VL_API_KEYS "
                                  "is empty (anyone could stop the engine with one request)")  # fmt: skip
    entries = "owner:sk-owner-0123456789abcdef:admin,ops:sk-ops-0123456789abcdef:swap,dev:sk-dev-0123456789abcdef"
    keys = ApiKeys(load_settings({"VL_API_KEYS": entries}).api_keys, b"")
    rights = {caller.label: (caller.admin, caller.swaps) for caller, _ in keys.keys}
    assert rights == {"owner": (True, True), "ops": (False, True), "dev": (False, False)}
    unmarked = ApiKeys(load_settings({"VL_API_KEYS": "a:sk-a-0123456789abcdef,b:sk-b-0123456789abcdef"}).api_keys, b"")
    assert [caller.swaps for caller, _ in unmarked.keys] == [True, False]  # no roles: the first entry is the admin


def test_the_state_file_reads_back_and_a_broken_one_reads_as_none(tmp_path: Path) -> None:
    assert read_state(tmp_path) is None
    state = SwapState(loaded="tiny", recipe_names={"tiny": ["tiny", "claude-tiny"]}, windows={"tiny2": 4096})
    write_state(tmp_path, state)
    assert read_state(tmp_path) == state
    (tmp_path / "swap.state.json").write_text("{not json")
    assert read_state(tmp_path) is None


def test_the_bridge_parses_the_state_file_once_per_change_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[Path] = []
    read_json = statefile.read_json
    monkeypatch.setattr(statefile, "read_json", lambda path: parsed.append(path) or read_json(path))
    swaps = swaps_on(tmp_path, SwapState(loaded="tiny", recipe_names={"tiny": ["tiny"]}))
    for _ in range(3):
        assert swaps.state() == SwapState(loaded="tiny", recipe_names={"tiny": ["tiny"]})
    assert len(parsed) == 1  # one parse for three requests' reads
    write_state(tmp_path, SwapState(loaded="tiny", recipe_names={"tiny": ["tiny"]}, phase="waiting", target="tiny2"))
    assert swaps.state().phase == "waiting" and len(parsed) == 2  # the pod replaced it: read anew
    (tmp_path / "swap.state.json").unlink()
    assert swaps.state() is None


def swaps_on(tmp_path: Path, state: SwapState) -> Swaps:
    catalog = Catalog()
    catalog.learn(LISTING)
    swaps = Swaps(("tiny:tiny", "tiny2:tiny2"), tmp_path, catalog, upstream=None)
    catalog.others = swaps.others
    write_state(tmp_path, state)
    return swaps


def test_only_a_request_for_an_unloaded_recipe_waits_and_the_listing_names_it(tmp_path: Path) -> None:
    swaps = swaps_on(
        tmp_path, SwapState(loaded="tiny", recipe_names={"tiny": ["tiny", "claude-tiny"]}, windows={"tiny2": 4096})
    )

    def must_wait(model: str) -> bool:
        return asyncio.run(swaps.must_wait_for(model, may_swap=True))

    assert not must_wait("tiny") and not must_wait("claude-sonnet-4-5")  # no VL_SWAP name: the loaded one
    assert must_wait("tiny2")
    assert "tiny2" in swaps.catalog.names() and swaps.catalog.anthropic_info("tiny2")["max_input_tokens"] == 4096
    write_state(tmp_path, SwapState(loaded="tiny", recipe_names={"tiny": ["tiny"]}, phase="starting", target="tiny2"))
    assert must_wait("tiny")  # the engine is down for the swap: every request waits


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


def test_a_key_without_the_swap_right_is_refused_a_swap_and_asks_for_nothing(tmp_path: Path) -> None:
    swaps = swaps_on(tmp_path, SwapState(loaded="tiny", recipe_names={"tiny": ["tiny", "claude-tiny"]}))

    def must_wait(model: str, may_swap: bool) -> bool:  # a request's first question, as MessagesExchange asks it
        return asyncio.run(swaps.must_wait_for(model, may_swap))

    with pytest.raises(BridgeError) as refused:
        must_wait("tiny2", may_swap=False)
    assert refused.value.status == 403 and refused.value.type == "permission_error"
    assert refused.value.message.startswith(
        "this key may not change the loaded model (tiny is loaded; tiny2 would restart"
    )
    with pytest.raises(BridgeError, match="may not change the loaded model"):
        asyncio.run(swaps.ready_for("tiny2", 0.5, may_swap=False))
    assert asked(tmp_path) is None  # no swap asked
    for allowed in ("tiny", "claude-tiny", "claude-sonnet-4-5"):  # the loaded recipe, or a name of none: served
        assert must_wait(allowed, may_swap=False) is False
    assert must_wait("tiny2", may_swap=True) is True  # the owner's request waits, and its wait asks for the swap
    under_way = SwapState(loaded="tiny", recipe_names={"tiny": ["tiny"]}, phase="starting", target="tiny2")
    write_state(tmp_path, under_way)
    assert must_wait("tiny2", may_swap=False) is True  # the swap under way is not this key's doing: it may wait


def test_a_waiting_swap_is_dropped_when_a_key_that_may_swap_asks_for_the_loaded_model(tmp_path: Path) -> None:
    waiting = SwapState(loaded="tiny", recipe_names={"tiny": ["tiny", "claude-tiny"]}, phase="waiting", target="tiny2")
    swaps = swaps_on(tmp_path, waiting)
    swap.ask_for(tmp_path, "tiny2")
    for model, may_swap in (("claude-sonnet-4-5", True), ("tiny", False)):  # a name of no recipe; a key that may not
        assert asyncio.run(swaps.must_wait_for(model, may_swap)) is False  # served by the loaded model meanwhile
        assert asked(tmp_path) == "tiny2"
    assert asyncio.run(swaps.must_wait_for("claude-tiny", may_swap=True)) is False
    assert asked(tmp_path) == "tiny"  # the pod drops the waiting swap (Swapper.held_back)
