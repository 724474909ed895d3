"""``slurm_burst.deploy.to_toml``: a mapping (the role's ``slurm_burst_config``) as TOML.

Only what a slurm-burst config holds: tables, strings, booleans, integers, finite floats
and lists of those (a table inside a list is written inline). Anything else (None, NaN,
bytes, a key that is not a string) is an error that names where it is, so a wrong
variable fails the play before a file is written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(k: Any, where: str) -> str:
    if not isinstance(k, str) or not k:
        raise AnsibleFilterError(f"to_toml: {where}: keys must be non-empty strings, got {k!r}")
    if _BARE.fullmatch(k):
        return k
    return _string(k)


def _string(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _value(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise AnsibleFilterError(f"to_toml: {where}: {v!r} is not a finite number")
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x, f"{where}[{i}]") for i, x in enumerate(v)) + "]"
    if isinstance(v, Mapping):
        inner = ", ".join(f"{_key(k, where)} = {_value(x, f'{where}.{k}')}" for k, x in v.items())
        return "{ " + inner + " }" if inner else "{}"
    raise AnsibleFilterError(f"to_toml: {where}: cannot write {type(v).__name__} {v!r} as TOML")


def _table(data: Mapping[str, Any], path: list[str], lines: list[str]) -> None:
    where = ".".join(path) or "the top level"
    scalars = [(k, v) for k, v in data.items() if not isinstance(v, Mapping)]
    tables = [(k, v) for k, v in data.items() if isinstance(v, Mapping)]
    if path and (scalars or not tables):
        lines.append("")
        lines.append("[" + ".".join(_key(p, where) for p in path) + "]")
    for k, v in scalars:
        lines.append(f"{_key(k, where)} = {_value(v, f'{where}.{k}' if path else k)}")
    for k, v in tables:
        _table(v, [*path, k], lines)


def to_toml(data: Any) -> str:
    if not isinstance(data, Mapping):
        raise AnsibleFilterError(f"to_toml: expected a mapping, got {type(data).__name__}")
    lines: list[str] = []
    _table(data, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"to_toml": to_toml}
