"""Parse ``sinfo --json`` / ``squeue --json`` by their OpenAPI schema version.

Slurm changes these documents between releases (22.05 = v0.0.38; 23.02 = v0.0.39;
23.11 = v0.0.40 ...). The parser is chosen from ``meta.plugin.type``; a new
schema is a new pair of functions registered in ``PARSERS``, and an unknown one
is an explicit error rather than a silent misreading.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from slurm_burst.core.slurm import SlurmJob, SlurmNode


class SchemaError(ValueError):
    """Slurm's JSON is of a schema we do not know, or not shaped as its schema says."""


def schema_version(doc: Mapping[str, Any]) -> str:
    try:
        plugin = doc["meta"]["plugin"]["type"]  # "openapi/v0.0.38"
    except (KeyError, TypeError) as exc:
        raise SchemaError("no meta.plugin.type in Slurm's JSON output") from exc
    return str(plugin).rpartition("/")[2]


def _time(value: Any) -> datetime | None:
    if isinstance(value, dict):  # v0.0.39+: {"set": bool, "infinite": bool, "number": int}
        value = value.get("number") if value.get("set") else None
    if not value:
        return None
    return datetime.fromtimestamp(int(value), tz=UTC)


def _tres(text: str) -> dict[str, str]:
    out = {}
    for item in (text or "").split(","):
        key, sep, value = item.partition("=")
        if sep:
            out[key] = value
    return out


def _split(text: str) -> tuple[str, ...]:
    return tuple(filter(None, (text or "").split(",")))


def nodes_v0038(doc: Mapping[str, Any]) -> list[SlurmNode]:
    """Nodes of a v0.0.38 document. Values most nodes share (state, flags, partitions,
    features) are made once and shared: 20,000 nodes cost a few MB, not tens."""
    out = []
    same: dict[Any, Any] = {}
    for n in doc["nodes"]:
        flags = tuple(n.get("state_flags") or ())
        parts = tuple(n.get("partitions") or ())
        feats = n.get("active_features") or n.get("features", "")
        state = str(n["state"])
        out.append(
            SlurmNode(
                name=n["name"],
                state=same.get(("s", state)) or same.setdefault(("s", state), state.lower()),
                flags=same.get(flags)
                or same.setdefault(flags, frozenset(map(str.upper, map(str, flags)))),
                partitions=same.setdefault(("p", parts), parts),
                features=same.get(("f", feats)) or same.setdefault(("f", feats), _split(feats)),
                gres=n.get("gres", ""),
                addr=n.get("address", ""),
                hostname=n.get("hostname", ""),
                reason=n.get("reason", ""),
                cpus=int(n.get("cpus") or 0),
                real_memory_mb=int(n.get("real_memory") or 0),
                boot_time=_time(n.get("boot_time")),
            )
        )
    return out


def jobs_v0038(doc: Mapping[str, Any]) -> list[SlurmJob]:
    out = []
    for j in doc["jobs"]:
        limit = j.get("time_limit")
        out.append(
            SlurmJob(
                job_id=int(j["job_id"]),
                name=j.get("name", ""),
                state=str(j["job_state"]).upper(),
                partition=j.get("partition", ""),
                nodes=j.get("nodes", ""),
                account=j.get("account", ""),
                user=j.get("user_name", ""),
                time_limit_min=int(limit)
                if isinstance(limit, int) and limit < 0xFFFFFFFE
                else None,
                tres_requested=_tres(j.get("tres_req_str", "")),
                tres_allocated=_tres(j.get("tres_alloc_str", "")),
                node_count=int(j.get("node_count") or 0),
                cpus=int(j.get("cpus") or 0),
                submit_time=_time(j.get("submit_time")),
                start_time=_time(j.get("start_time")),
                end_time=_time(j.get("end_time")),
                reason=j.get("state_reason", ""),
            )
        )
    return out


Parser = tuple[
    Callable[[Mapping[str, Any]], list[SlurmNode]], Callable[[Mapping[str, Any]], list[SlurmJob]]
]
PARSERS: dict[str, Parser] = {"v0.0.38": (nodes_v0038, jobs_v0038)}


def _parser(doc: Mapping[str, Any]) -> Parser:
    version = schema_version(doc)
    if version not in PARSERS:
        raise SchemaError(
            f"Slurm JSON schema {version} is not supported yet (supported: {', '.join(PARSERS)})"
        )
    return PARSERS[version]


def _parse(doc: Mapping[str, Any], which: int, tool: str) -> list[Any]:
    parser = _parser(doc)[which]
    try:
        return parser(doc)
    except (KeyError, TypeError, ValueError) as exc:
        raise SchemaError(f"{tool} JSON not shaped as {schema_version(doc)}: {exc!r}") from exc


def parse_nodes(doc: Mapping[str, Any]) -> list[SlurmNode]:
    return _parse(doc, 0, "sinfo")


def parse_jobs(doc: Mapping[str, Any]) -> list[SlurmJob]:
    return _parse(doc, 1, "squeue")
