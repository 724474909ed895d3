"""Parse ``sinfo --json`` / ``squeue --json`` by their OpenAPI schema version.

Slurm changes these documents between releases (22.05 = v0.0.38; 23.02 = v0.0.39;
23.11 = v0.0.40; 24.11 = v0.0.42 ...). The parser is chosen from the document's own
``meta`` block (``meta.plugin.type`` up to 23.02, ``meta.plugin.data_parser`` since);
the parsers read both shapes below, a new schema is registered in ``SCHEMAS`` once they
read it, and an unknown one is an explicit error naming the Slurm release rather than a
silent misreading.

v0.0.42 (recorded from 24.11.5, tests/data/slurm-24.11): per-node records come from
``scontrol show nodes --json`` (``sinfo --json`` groups nodes by state there); a state
is a list, its first element the base state and the rest its flags; numbers are
``{"set", "infinite", "number"}`` objects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from slurm_burst.core.errors import BurstError
from slurm_burst.core.slurm import SlurmJob, SlurmNode


class SchemaError(BurstError, ValueError):
    """Slurm's JSON is of a schema we do not know, or not shaped as its schema says."""

    code = "SlurmSchema"


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
    seconds = _number(value)
    return datetime.fromtimestamp(seconds, tz=UTC) if seconds else None


def _tres(text: str) -> dict[str, str]:
    out = {}
    for item in (text or "").split(","):
        key, sep, value = item.partition("=")
        if sep:
            out[key] = value
    return out


def _split(text: str) -> tuple[str, ...]:
    return tuple(filter(None, (text or "").split(",")))


def _state_and_flags(n: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
    """v0.0.38: ``state`` a string and ``state_flags`` a list; v0.0.42: one list, the
    base state first."""
    state = n["state"]
    if isinstance(state, list):
        return str(state[0]), tuple(state[1:])
    return str(state), tuple(n.get("state_flags") or ())


def _nodes(doc: Mapping[str, Any]) -> list[SlurmNode]:
    """Nodes of a v0.0.38 ``sinfo --json`` or v0.0.42 ``scontrol show nodes --json``
    document. Values most nodes share (state, flags, partitions, features) are made once
    and shared: 20,000 nodes cost a few MB, not tens."""
    out = []
    same: dict[Any, Any] = {}
    for n in doc["nodes"]:
        state, flags = _state_and_flags(n)
        parts = tuple(n.get("partitions") or ())
        feats = _csv(n.get("active_features") or n.get("features", ""))
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
                cpus=_number(n.get("cpus")),
                real_memory_mb=_number(n.get("real_memory")),
                boot_time=_time(n.get("boot_time")),
                instance_id=str(n.get("instance_id") or ""),
            )
        )
    return out


def _job_state(value: Any) -> str:
    """v0.0.38: a string; v0.0.42: the base state and its flags, where CONFIGURING (a job
    waiting for its powered-up nodes) is reported as the state, as v0.0.38 does."""
    if isinstance(value, list):
        states = [str(x).upper() for x in value]
        return "CONFIGURING" if "CONFIGURING" in states else states[0]
    return str(value).upper()


def _limit(value: Any) -> int | None:
    """A time limit in minutes; None for none (v0.0.38: 0xFFFFFFFE and up; v0.0.42:
    ``infinite`` or not ``set``)."""
    if isinstance(value, dict):
        return None if value.get("infinite") or not value.get("set") else _number(value)
    return int(value) if isinstance(value, int) and value < 0xFFFFFFFE else None


def _jobs(doc: Mapping[str, Any]) -> list[SlurmJob]:
    """Jobs of a v0.0.38 or v0.0.42 ``squeue --json`` document."""
    return [
        SlurmJob(
            job_id=int(j["job_id"]),
            name=j.get("name", ""),
            state=_job_state(j["job_state"]),
            partition=j.get("partition", ""),
            nodes=j.get("nodes", ""),
            account=j.get("account", ""),
            user=j.get("user_name", ""),
            time_limit_min=_limit(j.get("time_limit")),
            tres_requested=_tres(j.get("tres_req_str", "")),
            tres_allocated=_tres(j.get("tres_alloc_str", "")),
            node_count=_number(j.get("node_count")),
            cpus=_number(j.get("cpus")),
            submit_time=_time(j.get("submit_time")),
            start_time=_time(j.get("start_time")),
            end_time=_time(j.get("end_time")),
            reason=j.get("state_reason", ""),
        )
        for j in doc["jobs"]
    ]


# the schemas the parsers read, and the Slurm release each was recorded from
SCHEMAS = {"v0.0.38": "22.05", "v0.0.42": "24.11", "v0.0.45": "26.05"}


def _check(doc: Mapping[str, Any]) -> None:
    version = schema_version(doc)
    if version not in SCHEMAS:
        release = slurm_release(doc)
        by = f"Slurm {release}'s" if release else "Slurm"
        supported = ", ".join(f"{v} (Slurm {r})" for v, r in SCHEMAS.items())
        raise SchemaError(
            f"{by} JSON schema {version} is not supported yet (supported: {supported})"
        )


def _parse(doc: Mapping[str, Any], parser: Callable[[Mapping[str, Any]], list[Any]],
           tool: str) -> list[Any]:  # fmt: skip
    _check(doc)
    try:
        return parser(doc)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise SchemaError(f"{tool} JSON not shaped as {schema_version(doc)}: {exc!r}") from exc


def parse_nodes(doc: Mapping[str, Any]) -> list[SlurmNode]:
    return _parse(doc, _nodes, "sinfo")


def parse_jobs(doc: Mapping[str, Any]) -> list[SlurmJob]:
    return _parse(doc, _jobs, "squeue")
