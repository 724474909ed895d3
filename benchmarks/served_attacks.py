"""One node against the daemon's HTTP services (issue 47):
``python benchmarks/served_attacks.py [--json] [--burners] [--requests N]``.

The node API and a mesh store, each served on loopback, attacked from one address
while a well-behaved node makes N requests (200), each on a connection of its own: 64
bodies trickled a byte every two seconds, request headers trickled the same way, 1,100
idle connections, and no attack (the baseline). Figures per server and attack:
``<server>_<attack>_p50_ms``, ``_p99_ms``, ``_max_ms`` of the well-behaved node's
requests (goal: p99 under 1,000 ms), ``_attacker_slots`` (the most slots the attacker
held at once) and ``_attacker_connections`` (those it held open). ``--burners``: two CPU
burners beside it all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launch import burners  # noqa: E402

from tests.integration.test_served_attacks import (  # noqa: E402
    ATTACKER,
    ATTACKS,
    serving,
    well_behaved,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--burners", action="store_true", help="two CPU burners alongside")
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    out: dict[str, Any] = {"cpus": os.cpu_count(), "burners": 2 if args.burners else 0,
                           "requests": args.requests}  # fmt: skip
    attacks = {"none": lambda t: contextlib.nullcontext(), **ATTACKS}
    with burners(2 if args.burners else 0):
        for kind in ("node-api", "mesh-store"):
            for name, attack in attacks.items():
                with tempfile.TemporaryDirectory() as tmp, serving(kind, Path(tmp)) as target:
                    guard = target.served.guard
                    assert guard is not None
                    with attack(target):
                        conns = guard.connections(ATTACKER)
                        took = well_behaved(target, args.requests)
                    key = f"{kind.replace('-', '_')}_{name.replace('-', '_')}"
                    out[f"{key}_p50_ms"] = round(1000 * took[len(took) // 2], 2)
                    out[f"{key}_p99_ms"] = round(1000 * took[int(0.99 * (len(took) - 1))], 2)
                    out[f"{key}_max_ms"] = round(1000 * took[-1], 2)
                    out[f"{key}_attacker_slots"] = guard.peak[ATTACKER]
                    out[f"{key}_attacker_connections"] = conns
                    if not args.json:
                        print(f"{key:>34}: p99 {out[f'{key}_p99_ms']:8.2f} ms", file=sys.stderr)
    p99s = [v for k, v in out.items() if k.endswith("_p99_ms")]
    out["worst_p99_ms"] = max(p99s)
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
