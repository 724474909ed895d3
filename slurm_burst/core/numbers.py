"""Numbers read from text people and programs give us: ASCII digits only, within bounds.

``str.isdigit`` accepts superscripts and other scripts' digits that ``int`` then refuses
('²') or reads ('٣' is 3): a check that passes what the parse fails is a traceback, and
one that parses what Slurm or a person would not is a surprise. Pure: stdlib only.
"""

from __future__ import annotations

import re

_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_SIGNED = re.compile(r"-?[0-9]+", re.ASCII)
# a decimal as people write one: digits, one point, an exponent of at most three digits
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?", re.ASCII)


def is_digits(text: str) -> bool:
    """``text`` is one or more ASCII digits, nothing else."""
    return _DIGITS.fullmatch(text) is not None


def whole(text: str, low: int, high: int, what: str, signed: bool = False) -> int:
    """``text`` as an integer in [low, high]; ValueError naming ``what`` otherwise. At
    most 19 digits are read: a longer number is past any bound we set."""
    text = text.strip()
    pattern = _SIGNED if signed else _DIGITS
    if pattern.fullmatch(text) is None or len(text.lstrip("-")) > 19:
        raise ValueError(f"{what} {text[:40]!r} is not a whole number (ASCII digits)")
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"{what} {value:,} is not between {low:,} and {high:,}")
    return value


def is_decimal(text: str) -> bool:
    """``text`` is a decimal number in ASCII: digits, one point, an exponent of at most
    three digits (surrounding blanks allowed). ``Decimal`` and ``float`` also read '٣',
    '1_0', 'NaN', 'Infinity' and '0x1p3': a check before them keeps those out."""
    text = text.strip()
    return len(text) <= 40 and _DECIMAL.fullmatch(text) is not None


def json_count(v: object) -> int:
    """A count from a parsed JSON answer (a child's, a node's): a non-negative integer,
    anything else (a string, a bool, a float, a negative number) counts as 0."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0
