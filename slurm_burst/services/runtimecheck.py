"""The runtime step of a node's join: the node captures what its group's reference
manifest holds (``node/runtime.py capture --like``), and the daemon compares the two
(``core.runtime``); a node that differs beyond the group's rule never joins.

It runs after the slurmd release and GPU checks and before anything of the site (the
mesh address, the munge key, slurmd) reaches the node, so a refused node has seen no
secret and run no job. The node is less trusted than the daemon: it only reports; what
it says is read within bounds, and the judgement is the daemon's. A refusal is
``RuntimeMismatch`` (its differences in the event ``node.runtime_mismatch``, the
node's reason and the ledger's instance row); a reference the daemon cannot read is
``RuntimeReference`` (the site's to fix: every node of the group would meet it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from slurm_burst.config import NodeGroup
from slurm_burst.core.errors import StepError
from slurm_burst.core.jsonread import BadJson, read_json
from slurm_burst.core.records import NodeRecord
from slurm_burst.core.runtime import (
    Difference,
    Manifest,
    ManifestError,
    compare,
    field_class,
    from_document,
    mismatches,
)
from slurm_burst.ports import Clock, NodeStore, RemoteShell

log = logging.getLogger(__name__)

RUNTIME_PROGRAM = "/etc/slurm-burst/runtime.py"
RUNTIME_REFERENCE = "/etc/slurm-burst/runtime-reference.json"
MAX_REPORT = 1024 * 1024  # what a node may answer
MAX_DETAIL = 900  # characters of differences in an event and a reason


@dataclass(frozen=True, kw_only=True)
class RuntimeCheckPorts:
    store: NodeStore
    clock: Clock
    program: bytes  # node/runtime.py
    reference: Callable[[str], tuple[Manifest, bytes]]  # path -> (manifest, its bytes)
    keep: Callable[[str, bytes], None]  # node, what it said: kept for runtime diff


class RuntimeCheck:
    def __init__(self, ports: RuntimeCheckPorts) -> None:
        self.ports = ports

    def check(
        self,
        sh: RemoteShell,
        rec: NodeRecord,
        group: NodeGroup,
        step: Callable[..., str],
    ) -> None:
        """Refuse ``rec``'s node (StepError) unless its runtime is ``group``'s within
        the group's rule. ``step(sh, name, *args)`` runs a bootstrap step."""
        try:
            reference, raw = self.ports.reference(group.runtime_manifest)
        except ManifestError as exc:
            raise StepError("RuntimeReference", str(exc)) from None
        step(sh, "gpu-prepare")  # /etc/slurm-burst
        sh.put(self.ports.program, RUNTIME_PROGRAM, 0o644)
        sh.put(raw, RUNTIME_REFERENCE, 0o644)
        said = step(sh, "runtime-capture").strip().splitlines()
        where = f"node {rec.name}'s runtime manifest"
        try:
            doc = read_json(said[-1] if said else "", where, max_bytes=MAX_REPORT)
            found = from_document(doc, where)
        except (BadJson, ManifestError) as exc:
            raise StepError("RuntimeMismatch", f"unreadable: {exc}") from None
        self.ports.keep(rec.name, json.dumps(doc, sort_keys=True).encode())
        # a group's images are loaded, each checked against its pinned digest, after
        # this step (images need the mesh): the reference's image digests are not asked
        reference = replace(
            reference,
            fields={k: v for k, v in reference.fields.items() if field_class(k) != "image"},
        )
        diffs = compare(reference, found, group.runtime_rule)
        bad = mismatches(diffs)
        if bad:
            detail = _detail(bad, group.runtime_rule)
            now = self.ports.clock.now()
            self.ports.store.event(now, "node.runtime_mismatch", rec.name, detail)
            raise StepError("RuntimeMismatch", detail)
        log.info(
            "node.runtime_ok node=%s rule=%s fields=%d within_rule=%d",
            rec.name, group.runtime_rule, len(reference.fields), len(diffs),
        )  # fmt: skip


def _detail(bad: list[Difference], rule: str) -> str:
    text = f"{len(bad)} field(s) differ beyond '{rule}': " + "; ".join(d.line() for d in bad)
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 3] + "..."
