"""What `runtime start` hands the bridge: its own settings, as text the bridge reads back unchanged."""

from __future__ import annotations

from runtime.settings import VARIABLES, Scope, load_settings
from runtime.start import bridge_environ


def test_the_bridge_reads_back_exactly_the_effective_bridge_settings() -> None:
    remote = {"VL_ALIASES": "claude-x, my-alias", "VL_BRIDGE_PING_S": "7.5", "VL_LOG_PROMPTS": "on"}
    effective = load_settings({"VL_API_KEYS": "k1,k2", "VL_MAX_BODY_MB": "8"}, remote)
    read_back = load_settings(bridge_environ(effective))
    for variable in VARIABLES:
        if variable.scope is Scope.BRIDGE:
            assert getattr(read_back, variable.attr) == getattr(effective, variable.attr), variable.env


def test_engine_settings_stay_out_of_the_bridge_command() -> None:
    assert set(bridge_environ(load_settings({"VL_CTX": "4096"}))) == {
        v.env for v in VARIABLES if v.scope is Scope.BRIDGE
    }
