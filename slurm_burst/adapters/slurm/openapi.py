"""Parse ``sinfo --json`` / ``squeue --json`` by their OpenAPI schema version.

Slurm changes these documents between releases (22.05 = v0.0.38; 23.02 = v0.0.39;
23.11 = v0.0.40; 24.11 = v0.0.42 ...). The parser is chosen from the document's own
``meta`` block (``meta.plugin.type`` up to 23.02, ``meta.plugin.data_parser`` since);
a new schema is a new pair of functions registered in ``PARSERS``, and an unknown one is
an explicit error naming the Slurm release rather than a silent misreading.

v0.0.42 (recorded from 24.11.5, tests/data/slurm-24.11): per-node records come from
``scontrol show nodes --json`` (``sinfo --json`` groups nodes by state there); a state
is a list, its first element the base state and the rest its flags; numbers are
``{"set", "infinite", "number"}`` objects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from slurm_burst.core.slurm import SlurmJob, SlurmNode


class SchemaError(ValueError):
    """Slurm's JSON is of a schema we do not know, or not shaped as its schema says."""


def schema_version(doc: Mapping[str, Any]) -> str:
    """``v0.0.38`` from ``"openapi/v0.0.38"`` (22.05) or ``"data_parser/v0.0.42"`` (24.11)."""
    try:
        plugin = doc["meta"]["plugin"]
        name = plugin.get("data_parser") or plugin["type"]
    except (KeyError, TypeError, AttributeError) as exc:
        raise SchemaError("no meta.plugin in Slurm's JSON output") from exc
    return str(name).rpartition("/")[2]


def slurm_release(doc: Mapping[str, Any]) -> str:
    """The Slurm release that printed ``doc`` ('24.11.5'), or '' if it does not say."""
    meta = doc.get("meta") if isinstance(doc, Mapping) else None
    slurm = (meta or {}).get("slurm") or (meta or {}).get("Slurm") or {}
    if not isinstance(slurm, Mapping):
        return ""
    if slurm.get("release"):
        return str(slurm["release"])
    v = slurm.get("version") or {}
    return ".".join(str(v.get(k, "?")) for k in ("major", "minor", "micro")) if v else ""


def _number(value: Any) -> int:
    """An integer, from a plain number (v0.0.38) or a {"set", "number"} object."""
    if isinstance(value, dict):
        return int(value.get("number") or 0) if value.get("set") else 0
    return int(value or 0)


def _csv(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value or "")


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


def nodes_v0042(doc: Mapping[str, Any]) -> list[SlurmNode]:
    """Nodes of a v0.0.42 ``scontrol show nodes --json`` document."""
    out = []
    for n in doc["nodes"]:
        state = [str(x) for x in n["state"]]
        out.append(
            SlurmNode(
                name=n["name"],
                state=state[0].lower(),
                flags=frozenset(x.upper() for x in state[1:]),
                partitions=tuple(n.get("partitions") or ()),
                features=_split(_csv(n.get("active_features") or n.get("features"))),
                gres=n.get("gres", ""),
                addr=n.get("address", ""),
                hostname=n.get("hostname", ""),
                reason=n.get("reason", ""),
                cpus=_number(n.get("cpus")),
                real_memory_mb=_number(n.get("real_memory")),
                boot_time=_time(n.get("boot_time")),
            )
        )
    return out


def jobs_v0042(doc: Mapping[str, Any]) -> list[SlurmJob]:
    """Jobs of a v0.0.42 ``squeue --json`` document. A job's state list is its base state
    and flags; CONFIGURING (a job waiting for its powered-up nodes) is reported as the
    state, as v0.0.38 does."""
    out = []
    for j in doc["jobs"]:
        states = [str(x).upper() for x in j["job_state"]]
        limit = j.get("time_limit")
        unlimited = isinstance(limit, dict) and (limit.get("infinite") or not limit.get("set"))
        out.append(
            SlurmJob(
                job_id=int(j["job_id"]),
                name=j.get("name", ""),
                state="CONFIGURING" if "CONFIGURING" in states else states[0],
                partition=j.get("partition", ""),
                nodes=j.get("nodes", ""),
                account=j.get("account", ""),
                user=j.get("user_name", ""),
                time_limit_min=None if unlimited else _number(limit),
                tres_requested=_tres(j.get("tres_req_str", "")),
                tres_allocated=_tres(j.get("tres_alloc_str", "")),
                node_count=_number(j.get("node_count")),
                cpus=_number(j.get("cpus")),
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
PARSERS: dict[str, Parser] = {
    "v0.0.38": (nodes_v0038, jobs_v0038),  # 22.05
    "v0.0.42": (nodes_v0042, jobs_v0042),  # 24.11
}


def _parser(doc: Mapping[str, Any]) -> Parser:
    version = schema_version(doc)
    if version not in PARSERS:
        release = slurm_release(doc)
        by = f"Slurm {release}'s" if release else "Slurm"
        raise SchemaError(
            f"{by} JSON schema {version} is not supported yet (supported: "
            f"{', '.join(PARSERS)}: Slurm 22.05 and 24.11)"
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
