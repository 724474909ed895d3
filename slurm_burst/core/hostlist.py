"""Slurm hostlist expressions: parse, expand, compress, sort.

Slurm hands our hooks one argument such as ``burst-[1-3,7]`` or
``gpu-a[01-02]-[1-2],login1``; every node list we print for Slurm must be one
it parses back. This module reproduces Slurm 22.05's ``hostlist.c`` semantics,
checked against ``scontrol show hostnames|hostlist|hostlistsorted`` by a
property test:

* ``expand`` keeps order and duplicates (``a[1-2],a1`` -> ``a1 a2 a1``).
  Several bracket groups in one name form a product, the last varying fastest.
  A number's width is the width of the range's lower bound as written
  (``a[001-3]`` -> ``a001..a003``; ``a[1-010]`` -> ``a1..a10``).
* ``compress`` keeps order and merges a name into the previous range when it
  has the same prefix, continues it by one and has an equivalent width
  (Slurm's ``_width_equiv``: ``a9,a10`` -> ``a[9-10]`` but ``a8,a09`` stays
  ``a[8,09]``). ``compress(..., sort=True)`` is ``hostlistsorted``: prefixes
  in natural order (``strnatcmp``), names without a number first, then by
  width, then by number. ``unique=True`` also drops duplicates. (For overlapping
  duplicate ranges of mixed zero-padding, 22.05's ``hostlistsorted`` drops a
  host; we keep every name, see ``_sort_ranges``.)

Where Slurm is lax we are strict, because a hook acting on a misread list
powers up or tears down the wrong machines: empty parts (``a,,b``), brackets
that do not balance, text after a closing bracket (22.05 rejects it too),
reversed ranges, any character outside ``[A-Za-z0-9._-]`` (shell
metacharacters included) and names starting with ``-`` or ``.`` (they would
read as options) raise :class:`HostlistError` with the position.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from slurm_burst.core.errors import BadInput

DEFAULT_MAX_NAMES = 1_000_000
"""Expansion cap: a typo such as ``n[1-100000000]`` must not eat the controller's memory."""

_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_SEPARATORS = frozenset(", \t\n")
_TRAILING_DIGITS = re.compile(r"(.*?)([0-9]+)", re.DOTALL | re.ASCII)
# Slurm keeps host numbers in an unsigned long: 18 digits always fit. A longer number is
# an error here (and would otherwise meet Python's 4,300-digit int conversion limit).
MAX_DIGITS = 18


class HostlistError(BadInput, ValueError):
    """A hostlist expression that cannot be parsed; ``position`` is 0-based."""

    code = "BadHostlist"

    def __init__(self, expression: str, position: int, message: str) -> None:
        self.expression = expression
        self.position = position
        self.message = message
        shown = expression if len(expression) <= 120 else expression[:120] + "..."
        super().__init__(f"{message} at position {position} of hostlist {shown!r}")


@dataclass(frozen=True, slots=True)
class _Range:
    """One bracket group's range: ``lo..hi`` printed ``width`` digits wide."""

    lo: int
    hi: int
    width: int


def _check_chars(expr: str) -> None:
    for pos, ch in enumerate(expr):
        if ch not in _NAME_CHARS and ch not in _SEPARATORS and ch not in "[]":
            raise HostlistError(expr, pos, f"character {ch!r} is not allowed in a node name")


def _split_parts(expr: str) -> Iterator[tuple[int, str]]:
    """Yield (offset, part) for each top-level part; separators inside brackets stay."""
    depth = 0
    start = 0
    for pos, ch in enumerate(expr):
        if ch == "[":
            if depth:
                raise HostlistError(expr, pos, "nested '['")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostlistError(expr, pos, "']' without a matching '['")
            depth = 0
        elif ch in _SEPARATORS and not depth:
            if ch == "," and (pos == start or expr[pos - 1] == ","):
                raise HostlistError(expr, pos, "empty part")
            if pos > start:
                yield start, expr[start:pos]
            start = pos + 1
    if depth:
        raise HostlistError(expr, expr.rindex("["), "'[' is never closed")
    if start < len(expr):
        yield start, expr[start:]
    elif expr and expr[-1] == ",":
        raise HostlistError(expr, len(expr) - 1, "empty part after ','")


def _parse_ranges(expr: str, offset: int, body: str, max_names: int) -> list[_Range]:
    if not body:
        raise HostlistError(expr, offset, "empty brackets")
    ranges = []
    pos = offset
    for item in body.split(","):
        if not item:
            raise HostlistError(expr, pos, "empty range")
        lo_s, dash, hi_s = item.partition("-")
        if not lo_s.isdigit() or (dash and not hi_s.isdigit()) or not lo_s.isascii():
            raise HostlistError(expr, pos, f"range {item[:40]!r} is not N or N-M")
        if max(len(lo_s), len(hi_s)) > MAX_DIGITS:
            raise HostlistError(expr, pos, f"a host number has more than {MAX_DIGITS} digits")
        lo = int(lo_s)
        hi = int(hi_s) if dash else lo
        if hi < lo:
            raise HostlistError(expr, pos, f"range {item!r} is reversed")
        if hi - lo + 1 > max_names:
            raise HostlistError(expr, pos, f"range {item!r} exceeds the cap of {max_names} names")
        ranges.append(_Range(lo, hi, len(lo_s)))
        pos += len(item) + 1
    return ranges


def _expand_part(expr: str, offset: int, part: str, max_names: int) -> list[str]:
    """Expand one comma-free part such as ``gpu-a[01-02]-[1-2]``."""
    if not part.endswith("]"):
        raise HostlistError(
            expr, offset + part.rindex("]") + 1, "text after ']' is not allowed (Slurm rejects it)"
        )
    names = [""]
    pos = 0
    while pos < len(part):  # brackets are balanced and the part ends with one
        open_at = part.index("[", pos)
        close_at = part.index("]", open_at)
        ranges = _parse_ranges(expr, offset + open_at + 1, part[open_at + 1 : close_at], max_names)
        count = sum(r.hi - r.lo + 1 for r in ranges)
        if len(names) * count > max_names:
            raise HostlistError(
                expr, offset + open_at, f"expands past the cap of {max_names} names"
            )
        literal = part[pos:open_at]
        numbers = [f"{n:0{r.width}d}" for r in ranges for n in range(r.lo, r.hi + 1)]
        names = [f"{head}{literal}{num}" for head in names for num in numbers]
        pos = close_at + 1
    return names


def _check_digits(expr: str, offset: int, name: str) -> None:
    """A name's trailing host number has at most MAX_DIGITS digits (compress parses it)."""
    digits = len(name) - len(name.rstrip("0123456789"))
    if digits > MAX_DIGITS:
        raise HostlistError(
            expr, offset, f"a host number has {digits} digits (at most {MAX_DIGITS})"
        )


def expand(expr: str, *, max_names: int = DEFAULT_MAX_NAMES) -> list[str]:
    """Expand a hostlist expression into node names, in Slurm's order, duplicates kept."""
    _check_chars(expr)
    out: list[str] = []
    for offset, part in _split_parts(expr):
        if part[0] in "-.":
            # a leading '-' would turn a node name into an option of scontrol or ssh
            raise HostlistError(expr, offset, f"a node name cannot start with {part[0]!r}")
        names = [part] if "[" not in part else _expand_part(expr, offset, part, max_names)
        _check_digits(expr, offset, max(names, key=len))  # the part's longest number
        out.extend(names)
        if len(out) > max_names:
            raise HostlistError(expr, offset, f"expands past the cap of {max_names} names")
    if not out:
        raise HostlistError(expr, 0, "empty hostlist")
    return out


def expand_unique(expr: str, *, max_names: int = DEFAULT_MAX_NAMES) -> list[str]:
    """Expand, dropping repeats but keeping first-seen order."""
    return list(dict.fromkeys(expand(expr, max_names=max_names)))


# --- compression -----------------------------------------------------------


def _zero_padded(num: int, width: int) -> int:
    digits = len(str(num))
    return width - digits if width > digits else 0


def _width_equiv(n: int, wn: int, m: int, wm: int) -> int | None:
    """Slurm's ``_width_equiv``: the common width of two numbers, or None if incompatible."""
    if wn == wm:
        return wn
    npad, nmpad = _zero_padded(n, wn), _zero_padded(n, wm)
    mpad, mnpad = _zero_padded(m, wm), _zero_padded(m, wn)
    if npad != nmpad and mpad != mnpad:
        return None
    return wn  # the tail's width wins when the two are equivalent


def _split_name(name: str) -> tuple[str, int | None, int]:
    """``node017`` -> ("node", 17, 3); ``login`` -> ("login", None, 0)."""
    m = _TRAILING_DIGITS.fullmatch(name)
    if m is None:
        return name, None, 0
    return m.group(1), int(m.group(2)), len(m.group(2))


def _strnatcmp(a: str, b: str) -> int:
    """Port of strnatcmp.c (Martin Pool), which Slurm uses to order prefixes."""
    ai = bi = 0
    la, lb = len(a), len(b)
    while True:
        ca = a[ai] if ai < la else ""
        cb = b[bi] if bi < lb else ""
        while ca.isspace():
            ai += 1
            ca = a[ai] if ai < la else ""
        while cb.isspace():
            bi += 1
            cb = b[bi] if bi < lb else ""
        if ca.isdigit() and cb.isdigit():
            if ca == "0" or cb == "0":
                result = _compare_left(a, ai, b, bi)
            else:
                result = _compare_right(a, ai, b, bi)
            if result:
                return result
        if not ca and not cb:
            return 0
        if ca < cb:
            return -1
        if ca > cb:
            return 1
        ai += 1
        bi += 1


def _digit_at(s: str, i: int) -> str:
    return s[i] if i < len(s) and s[i].isdigit() else ""


def _compare_right(a: str, ai: int, b: str, bi: int) -> int:
    bias = 0
    while True:
        da, db = _digit_at(a, ai), _digit_at(b, bi)
        if not da and not db:
            return bias
        if not da:
            return -1
        if not db:
            return 1
        if da < db and not bias:
            bias = -1
        elif da > db and not bias:
            bias = 1
        ai += 1
        bi += 1


def _compare_left(a: str, ai: int, b: str, bi: int) -> int:
    while True:
        da, db = _digit_at(a, ai), _digit_at(b, bi)
        if not da and not db:
            return 0
        if not da:
            return -1
        if not db:
            return 1
        if da != db:
            return -1 if da < db else 1
        ai += 1
        bi += 1


def sort_names(names: Iterable[str]) -> list[str]:
    """Sort node names the way Slurm's ``hostlist_sort`` does."""
    split = [_split_name(n) for n in names]
    prefixes = sorted({p for p, _, _ in split}, key=functools.cmp_to_key(_strnatcmp))
    rank = {p: i for i, p in enumerate(prefixes)}
    split.sort(key=lambda s: (rank[s[0]], s[1] is not None, s[2], s[1] or 0))
    return [p if n is None else f"{p}{n:0{w}d}" for p, n, w in split]


def compress(names: Iterable[str], *, sort: bool = False, unique: bool = False) -> str:
    """Compress names into a hostlist expression Slurm parses back to the same names.

    Order is kept (``scontrol show hostlist``) unless ``sort`` (``hostlistsorted``);
    ``unique`` drops repeats (and implies ``sort``, as Slurm's ``hostlist_uniq``).
    """
    seq = list(names)
    for name in seq:
        if not name or name[0] in "-." or any(c not in _NAME_CHARS for c in name):
            raise HostlistError(name, 0, "not a valid node name")
        _check_digits(name, 0, name)
    if unique:
        seq = sort_names(dict.fromkeys(seq))
    ranges: list[_HostRange] = []
    for name in seq:
        prefix, num, width = _split_name(name)
        if num is not None and ranges:
            tail = ranges[-1]
            if (
                tail.prefix == prefix
                and not tail.single
                and tail.hi == num - 1
                and _width_equiv(tail.lo, tail.width, num, width) is not None
            ):
                tail.hi = num
                continue
        ranges.append(_HostRange(prefix, num or 0, num or 0, width, num is None))
    if sort and not unique:
        ranges = _sort_ranges(ranges)
    return _ranged_string(ranges)


@dataclass(slots=True)
class _HostRange:
    """Slurm's ``hostrange``: ``prefix`` + numbers ``lo..hi`` at ``width``, or one plain name."""

    prefix: str
    lo: int
    hi: int
    width: int
    single: bool

    def combinable(self, other: _HostRange) -> bool:
        return (
            self.prefix == other.prefix
            and not self.single
            and not other.single
            and _width_equiv(self.lo, self.width, other.lo, other.width) is not None
        )


def _sort_ranges(ranges: list[_HostRange]) -> list[_HostRange]:
    """``hostlist_sort``: order the ranges, then split overlaps and merge neighbours."""
    prefixes = sorted({r.prefix for r in ranges}, key=functools.cmp_to_key(_strnatcmp))
    rank = {p: i for i, p in enumerate(prefixes)}
    hr = sorted(ranges, key=lambda r: (rank[r.prefix], not r.single, r.width, r.lo))
    # hostlist_coalesce: split intersecting neighbours so duplicates stand alone.
    # Slurm assumes prev.lo <= nxt.lo here; with widths it merely deems equivalent
    # (``10`` then ``00``) that fails, it "intersects" disjoint ranges, empties one
    # and deletes the other, losing a host. We require a real overlap.
    i = len(hr) - 1
    while i > 0:
        prev, nxt = hr[i - 1], hr[i]
        if prev.combinable(nxt) and prev.lo <= nxt.lo < prev.hi:
            new_lo, new_hi = nxt.lo, min(nxt.hi, prev.hi)
            j = i
            if new_hi < prev.hi:
                nxt.hi = prev.hi
            prev.hi = new_lo
            nxt.lo = new_hi
            while new_lo <= new_hi:
                if new_lo > prev.hi:
                    hr.insert(j, _HostRange(prev.prefix, new_lo, new_lo, prev.width, False))
                    j += 1
                if new_lo < nxt.lo:
                    hr.insert(j, _HostRange(prev.prefix, new_lo, new_lo, prev.width, False))
                    j += 1
                new_lo += 1
            i = len(hr)
        i -= 1
    # hostlist_collapse: merge ranges that continue each other
    i = len(hr) - 1
    while i > 0:
        prev, nxt = hr[i - 1], hr[i]
        if prev.combinable(nxt) and prev.hi == nxt.lo - 1:
            prev.hi = nxt.hi
            del hr[i]
        i -= 1
    return hr


def _ranged_string(ranges: list[_HostRange]) -> str:
    out: list[str] = []
    i = 0
    while i < len(ranges):
        first = ranges[i]
        if first.single:
            out.append(first.prefix)
            i += 1
            continue
        j = i
        while (
            j + 1 < len(ranges)
            and ranges[j + 1].prefix == first.prefix
            and not ranges[j + 1].single
        ):
            j += 1
        group = ranges[i : j + 1]
        items = [
            f"{r.lo:0{r.width}d}" if r.lo == r.hi else f"{r.lo:0{r.width}d}-{r.hi:0{r.width}d}"
            for r in group
        ]
        if len(group) == 1 and first.lo == first.hi:
            out.append(f"{first.prefix}{items[0]}")
        else:
            out.append(f"{first.prefix}[{','.join(items)}]")
        i = j + 1
    return ",".join(out)
