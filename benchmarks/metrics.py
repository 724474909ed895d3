"""The metrics' figures (issue 19): the series a scrape returns for a daemon state of
2,000 and of 20,000 nodes (goal: <= 5,000, the same for both) and the CPU one scrape
costs at 20,000 nodes (goal: <= 50 ms).

The state is a large site's, fed through the same pure functions the reconcile pass
uses (summarize, findings, node_activity) and the Metrics port: 16 node groups over 3
providers and 3 sizes each, every node state, 2,000 on-prem nodes beside the cloud ones,
150 accounts that each spent in 3 groups (100 get series of their own), 50 budgets, 10
failure codes, 6 cloud calls, 14 bootstrap steps, 8 GPU groups, and histograms with
observations in every bucket.

    python benchmarks/metrics.py            # the figures
    python benchmarks/metrics.py --series   # JSON {nodes: series}, for the unit test
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client.exposition import generate_latest  # noqa: E402

from slurm_burst.adapters.metrics.prom import Metrics  # noqa: E402
from slurm_burst.core.fleetstatus import FleetStatus, GroupView  # noqa: E402
from slurm_burst.core.gpu import GroupGpus  # noqa: E402
from slurm_burst.core.nodestate import NodeState, Want  # noqa: E402
from slurm_burst.core.reconcile import findings, summarize  # noqa: E402
from slurm_burst.core.records import NodeRecord  # noqa: E402
from slurm_burst.core.slurm import SlurmNode, node_activity  # noqa: E402

GROUPS = [f"group{i:02d}" for i in range(16)]
PROVIDERS = ["aws", "gce", "azure"]
SIZES = ["small", "medium", "large"]
CODES = ["InsufficientInstanceCapacity", "RequestLimitExceeded", "AuthFailure", "BootTimeout",
         "SshUnreachable", "WireGuardHandshake", "SlurmdNotRegistered", "GpuUnhealthy",
         "InstanceVanished", "ResumeTimeout"]  # fmt: skip
CALLS = ["create_node", "list_nodes", "destroy_node", "get_node", "tag", "host_keys"]
STEPS = ["launch", "launch-batch", "boot", "attest", "ssh", "script", "gpu-check", "wg-key",
         "hub-peer", "wg-up", "munge", "nodeaddr", "slurmd", "teardown"]  # fmt: skip
SLURM_STATES = [("allocated", frozenset()), ("idle", frozenset()), ("mixed", frozenset()),
                ("idle", frozenset({"CLOUD", "POWERED_DOWN"})), ("down", frozenset({"DRAIN"})),
                ("idle", frozenset({"CLOUD", "POWERING_UP"}))]  # fmt: skip
STATES = list(NodeState)


def fill(m: Metrics, nodes: int, now: float = 1.8e9) -> None:
    """Everything the daemon reports about a site with ``nodes`` cloud nodes."""
    records = [
        NodeRecord(name=f"{GROUPS[i % 16]}-{i}", group=GROUPS[i % 16],
                   state=STATES[i % len(STATES)], want=Want.UP if i % 3 else Want.DOWN,
                   provider=PROVIDERS[i % 3], size=SIZES[i % 3], requested_at=now - i % 900)
        for i in range(nodes)
    ]  # fmt: skip
    by_group = summarize(records)
    m.fleet(FleetStatus(now, {
        g: GroupView(g, by_group.get(g, {}), 12.5, nodes // 16) for g in GROUPS
    }))  # fmt: skip
    slurm = [
        SlurmNode(name=r.name, state=SLURM_STATES[i % 6][0], flags=SLURM_STATES[i % 6][1])
        for i, r in enumerate(records)
    ] + [SlurmNode(name=f"onprem-{i}", state=SLURM_STATES[i % 3][0]) for i in range(2000)]
    cloud = {r.name for r in records}
    m.slurm_node_activity(node_activity(slurm, cloud.__contains__))
    suspects = {f"instance:{PROVIDERS[i % 3]}:i-{i}": now for i in range(nodes // 100)}
    suspects.update({f"peer:key{i}": now for i in range(nodes // 200)})
    f = findings(suspects, records, now, GROUPS, PROVIDERS)
    m.findings(f.orphans, f.stale_peers, f.leaked_addresses, f.oldest_resume)
    for i, r in enumerate(records):
        if i % 10 == 0:
            m.launched(r.group, r.provider, r.size)
            m.joined(r.group, 5.0 + i % 1800)
            m.step(STEPS[i % len(STEPS)], 0.05 * (i % 4000))
        if i % 50 == 0:
            m.failed(r.group, CODES[i % len(CODES)])
            m.cloud_call(r.provider, CALLS[i % len(CALLS)], 0.01 * (i % 3000),
                         CODES[i % 3] if i % 100 == 0 else None)  # fmt: skip
    accounts = [f"acct{i:03d}" for i in range(150)]
    m.spent({(a, GROUPS[(i + k) % 16]): 100.0 * i + k for i, a in enumerate(accounts)
             for k in range(3)})  # fmt: skip
    m.budgets({a: (1000.0, 400.0, 600.0) for a in accounts[:50]}, now + 86400)
    m.gpus({g: GroupGpus(gpus=nodes // 16, utilization=0.5, memory_used_bytes=1 << 34,
                         power_watts=250.0) for g in GROUPS[:8]}, None)  # fmt: skip
    m.reconcile_pass(0.5, now)
    for kind in ("terminate", "fail_node", "remove_peer", "release_address", "teardown"):
        m.reconcile_action(kind, "Orphan")
    m.phase_error("observe.cloud.aws")
    m.leading(True)
    m.heartbeat(now)
    m.ledger_ingested(now)


def series(text: bytes) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))


def main() -> None:
    counts = {}
    for nodes in (2_000, 20_000):
        m = Metrics(max_accounts=100)
        fill(m, nodes)
        counts[nodes] = series(generate_latest(m.registry))
    if "--series" in sys.argv:
        print(json.dumps(counts))
        return
    for nodes, n in counts.items():
        print(f"metrics: series scraped at {nodes:>6,} nodes   {n:>6,}  (goal <= 5,000)")
    print(f"metrics: same series at 2,000 and 20,000 nodes  {counts[2000] == counts[20000]}")
    m = Metrics(max_accounts=100)
    t0 = time.process_time()
    fill(m, 20_000)
    fill_cpu = time.process_time() - t0
    cpu = []
    for _ in range(50):
        t0 = time.process_time()
        text = generate_latest(m.registry)
        cpu.append(time.process_time() - t0)
    med = statistics.median(cpu)
    verdict = "OK" if med <= 0.050 else "OVER GOAL"
    print(
        f"metrics: one scrape at 20,000 nodes, CPU    median {med * 1000:6.2f} ms  "
        f"best {min(cpu) * 1000:6.2f} ms  ({len(text):,} bytes; goal <= 50 ms)  {verdict}"
    )
    print(
        f"metrics: building that state through the port  {fill_cpu * 1000:6.1f} ms CPU "
        "(the pure functions and the setters, once)"
    )


if __name__ == "__main__":
    main()
