"""The client SDKs the tests speak to the pod with (Anthropic's, OpenAI's), imported at their first use: collecting
the tests, and the quick layer, which starts nothing for them to speak to, never pays the ~2 s their import takes.

A module stand-in whose missing attributes are the real module's: pytest's collector reads every module-level name
(`isinstance` asks for `__class__`, which the stand-in has itself; its fixture scan probes private names, which it
refuses), so only a test that uses an SDK imports it."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any


class Imported(ModuleType):
    """The module of that name, imported when one of its own attributes is first read."""

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):  # pytest probes `_mock_name` and the like: no SDK's API begins so
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self.__name__), attribute)


if TYPE_CHECKING:
    import anthropic
    import openai
else:
    anthropic, openai = Imported("anthropic"), Imported("openai")

__all__ = ["anthropic", "openai"]
