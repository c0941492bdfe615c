"""How deeply a JSON text nests, measured before any decoder recurses into it.

msgspec, like every recursive decoder, overflows Python's stack near 1000 levels: 2 KB of brackets
on the public port gave a RecursionError, a 500 and a traceback. Measured first, it is a plain 400.
"""

from __future__ import annotations

import re
from array import array
from itertools import accumulate

from runtime.bridge.errors import BridgeError

# Claude Code's requests nest about 10 levels (an MCP tool's JSON schema, 20): 128 leaves room for
# any real tool input and stays far below the ~1000 levels where the decoder's recursion overflows.
MAX_JSON_DEPTH = 128

NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'"[]{}')))  # what a string's end and nesting need
STRING = re.compile(rb'"[^"]*(?:"|\Z)')  # to its quote, or to the end if unterminated; never backtracks
STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # as signed bytes: an opening bracket +1, a closing one -1
NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
CHUNK = 1 << 16  # brackets summed at a time: a deep body is refused after its first chunk


def bracket_steps(text: bytes) -> array[int]:
    """+1 for each bracket that opens, -1 for each that closes, outside strings, in order.
    Every step is a C-speed pass over the bytes: linear on any input, hostile ones included."""
    unescaped = text.replace(b"\\\\", b"").replace(b'\\"', b"")  # a string now ends at its next quote
    skeleton = unescaped.translate(None, NOT_STRUCTURE).replace(b'""', b"")  # strings without brackets go
    return array("b", STRING.sub(b"", skeleton).translate(STEPS, NOT_BRACKETS))


def nests_deeper_than(text: bytes, limit: int) -> bool:
    """Whether arrays and objects in `text` nest more than `limit` levels (an estimate on malformed
    JSON, which the decoder refuses anyway); without recursion, so any depth can be measured."""
    steps, depth = bracket_steps(text), 0
    for start in range(0, len(steps), CHUNK):
        running = list(accumulate(steps[start : start + CHUNK], initial=depth))
        if max(running) > limit:
            return True
        depth = running[-1]
    return False


def refuse_deep_nesting(body: bytes) -> None:
    """A 400 for a request body nested deeper than MAX_JSON_DEPTH, before any decoder sees it."""
    if nests_deeper_than(body, MAX_JSON_DEPTH):
        raise BridgeError(400, f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels")
