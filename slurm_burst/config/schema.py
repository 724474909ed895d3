"""Walk parsed TOML against the dataclass model, collecting every problem.

The model's type annotations are the schema: scalars, ``tuple[str, ...]``,
``Mapping[str, X]`` (TOML tables keyed by name) and nested dataclasses. Unknown
keys are problems with a did-you-mean, because a typo silently ignored is a
setting silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a configuration, by key path."""

    path: str
    message: str
    line: int | None = None
    severity: str = "error"  # or "warning"

    def render(self, source: str) -> str:
        """One line, whatever the config held: hidden characters shown escaped."""
        from slurm_burst.core.slurmsyntax import visible

        where = f"{source}:{self.line}" if self.line else source
        path = f"{self.path}: " if self.path else ""
        return visible(f"{where}: {self.severity}: {path}{self.message}")


# Bounds on the shape of any config, before the model reads it: the deepest setting is
# five levels down (node_groups.NAME.warm.WINDOW.nodes), no value is a page long, and
# no count, size or time needs more than 2**53 (where floats stop counting exactly).
MAX_DEPTH = 10
MAX_STRING = 4096
MAX_INTEGER = 2**53


def key_text(key: str) -> str:
    """A key for a problem's path: as it is when it is plain, else quoted as Python does."""
    return key if key.isascii() and key.isprintable() and "." not in key else repr(key)


def shape_problems(data: Mapping[str, Any]) -> list[Problem]:
    """What no setting can be, wherever it stands: a key or string holding a control,
    line-separator or format character (it would reach a Slurm file or a log line as
    something else), a string over 4,096 characters, an integer beyond 2**53, or
    nesting deeper than :data:`MAX_DEPTH` (floats: :func:`_scalar`). Walked without
    recursion."""
    from slurm_burst.core.slurmsyntax import hidden_character

    out: list[Problem] = []
    stack: list[tuple[str, Any, int]] = [("", data, 0)]
    while stack:
        path, value, depth = stack.pop()
        if depth > MAX_DEPTH:
            out.append(Problem(path, f"nested more than {MAX_DEPTH} levels deep: no setting is"))
            continue
        if isinstance(value, dict):
            for key, sub in value.items():
                where = _join(path, key_text(key))
                bad = hidden_character(key)
                if bad:
                    out.append(Problem(where, f"the key holds {bad}"))
                stack.append((where, sub, depth + 1))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v, depth + 1) for i, v in enumerate(value))
        elif isinstance(value, str):
            bad = hidden_character(value)
            if bad:
                out.append(
                    Problem(path, f"holds {bad}; no setting takes control or invisible characters")
                )
            elif len(value) > MAX_STRING:
                out.append(Problem(path, f"{len(value):,} characters, over {MAX_STRING:,}"))
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int) and abs(value) > MAX_INTEGER:
            out.append(Problem(path, "a number this large is no setting (at most 2**53)"))
    out.reverse()  # in the file's order, as far as a walk can tell
    return out


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def build(
    cls: type,
    data: Mapping[str, Any],
    path: str,
    problems: list[Problem],
    key_name: str | None = None,
) -> Any:
    """Build dataclass ``cls`` from a TOML table, appending problems; None if unusable."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    settable = {n for n in fields if n != "name" or key_name is None}
    for key in data:
        if key not in settable:
            close = difflib.get_close_matches(key, sorted(settable), n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            problems.append(Problem(_join(path, key), f"unknown key{hint}"))
    kwargs: dict[str, Any] = {}
    ok = True
    for name, f in fields.items():
        if name == "name" and key_name is not None:
            kwargs[name] = key_name
            continue
        required = f.default is MISSING and f.default_factory is MISSING
        if name not in data:
            if required:
                problems.append(Problem(_join(path, name), "required key is missing"))
                ok = False
            continue
        value, good = _convert(hints[name], data[name], _join(path, name), problems)
        if good:
            kwargs[name] = value
        elif required:
            ok = False
        # an optional key that failed keeps its default, so later checks still run
    if not ok:
        return None
    return cls(**kwargs)


def _convert(tp: Any, value: Any, path: str, problems: list[Problem]) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):  # X | None
        inner = next(a for a in args if a is not type(None))
        return _convert(inner, value, path, problems)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            problems.append(Problem(path, "must be a table"))
            return None, False
        built = build(tp, value, path, problems)  # type: ignore[arg-type]
        return built, built is not None
    if origin is tuple:
        elem = args[0] if args else str
        if elem is str:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                problems.append(Problem(path, "must be a list of strings"))
                return None, False
            return tuple(value), True
        if not isinstance(value, list):
            problems.append(Problem(path, f"must be a list of {elem.__name__}s"))
            return None, False
        items = []
        for i, v in enumerate(value):
            conv, good = _scalar(elem, v, f"{path}[{i}]", problems)
            if not good:
                return None, False
            items.append(conv)
        return tuple(items), True
    if origin is Mapping or origin is typing.Mapping:
        if not isinstance(value, dict):
            problems.append(Problem(path, "must be a table"))
            return None, False
        vt = args[1]
        out: dict[str, Any] = {}
        good = True
        for k, v in value.items():
            sub = _join(path, k)
            if dataclasses.is_dataclass(vt):
                if not isinstance(v, dict):
                    problems.append(Problem(sub, "must be a table"))
                    good = False
                    continue
                item = build(vt, v, sub, problems, key_name=k)  # type: ignore[arg-type]
                if item is not None:  # a broken item is left out; the others are still checked
                    out[k] = item
            elif vt is Any:
                scalar = str | int | float | bool
                if isinstance(v, list) and all(isinstance(x, scalar) for x in v):
                    v = tuple(v)
                elif isinstance(v, float) and not math.isfinite(v):
                    problems.append(Problem(sub, f"must be a finite number, not {v}"))
                    good = False
                elif not isinstance(v, scalar):
                    problems.append(
                        Problem(sub, "must be a string, number, boolean or a list of them")
                    )
                    good = False
                out[k] = v
            else:
                conv, g = _convert(vt, v, sub, problems)
                good &= g
                out[k] = conv
        return MappingProxyType(out), good
    return _scalar(tp, value, path, problems)


def _scalar(tp: Any, value: Any, path: str, problems: list[Problem]) -> tuple[Any, bool]:
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):  # TOML allows nan and inf; no setting means them
            problems.append(Problem(path, f"must be a finite number, not {value}"))
            return None, False
        return float(value), True
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value, True
    if tp is bool and isinstance(value, bool):
        return value, True
    if tp is str and isinstance(value, str):
        return value, True
    problems.append(Problem(path, f"must be {_TYPE_NAMES.get(tp, tp)}, not {type(value).__name__}"))
    return None, False
