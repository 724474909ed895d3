"""The one JSON reader for what a cloud node or a user sends: a node's answers (the GPU
check, the stage-in pull, the output scan, a GPU sample), an interruption notice, a
resume file, a spooled request, a child's answer, a manifest read back from a store.

``json.loads`` alone takes any size, any depth (deep nesting ends in ``RecursionError``
in its C scanner, or later in whatever walks the result), any count of values, and
reads ``NaN`` and ``Infinity``, which no JSON writer of ours makes. :func:`read_json`
bounds all four and says which one was broken, as :class:`BadJson`: a ``BadInput``
(code ``BadJson``, exit 2) and a ``ValueError``, so a caller that already refused
``json.loads``'s ``ValueError`` refuses these the same way. Pure: stdlib only.
"""

from __future__ import annotations

import json
from typing import Any

from slurm_burst.core.errors import BadInput

MAX_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 32  # our deepest document (a manifest) is 4 levels
MAX_VALUES = 2_000_000  # an output scan of 100,000 files is 500,000


class BadJson(BadInput, ValueError):
    """Text that is not the JSON we read: malformed, too large, too deep, too many
    values, or holding NaN or Infinity. The message names ``what`` and the bound."""

    code = "BadJson"


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_json(
    data: str | bytes,
    what: str,
    *,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    max_values: int = MAX_VALUES,
) -> Any:
    """``data`` parsed, within the bounds; :class:`BadJson` naming ``what`` otherwise."""
    if len(data) > max_bytes:
        raise BadJson(f"{what}: {len(data):,} bytes of JSON, over {max_bytes:,}")
    try:
        doc = json.loads(data, parse_constant=_constant)
    except RecursionError:
        raise BadJson(f"{what}: JSON nested deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise BadJson(f"{what}: not JSON ({str(exc)[:120]})") from None
    _bounded(doc, what, max_depth, max_values)
    return doc


def _bounded(doc: Any, what: str, max_depth: int, max_values: int) -> None:
    """Walk ``doc`` without recursion: its depth and its count of values."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > max_values:
            raise BadJson(f"{what}: more than {max_values:,} JSON values")
        if isinstance(value, dict | list):
            if depth > max_depth:
                raise BadJson(f"{what}: JSON nested deeper than {max_depth} levels")
            children = value.values() if isinstance(value, dict) else value
            stack.extend((c, depth + 1) for c in children)
