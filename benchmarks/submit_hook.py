"""What any user's script costs slurmctld in burst_buffer.lua's job_process (issue 47):
``python benchmarks/submit_hook.py [--json] [--quick] [--template FILE]``.

slurmctld runs ``slurm_bb_job_process`` holding its locks, for every job whose script
holds the directive. Each script below is timed over N calls by a real Lua 5.1 (the
library Slurm's burst_buffer/lua links on 22.05 and 26.05 alike: ``liblua5.1.so.0``),
with 22.05's arguments (the script only: the hook reads the job's partitions from its
``#SBATCH`` lines) and with 23.02-and-later's (26.05's: a ``job_info`` table):

- ``normal``: four stage-ins, a 2,000-line body;
- ``comment_lines``: the directive, then a megabyte of short comment lines;
- ``comment_words``: the directive, then one comment line of a megabyte of words;
- ``sbatch_lines``: a megabyte of ``#SBATCH`` lines (22.05 splits them for partitions);
- ``directive_words``: one directive line of a megabyte of words;
- ``late_directive``: a megabyte of comment lines, then the directive;
- ``full_header``, ``full_sbatch``: what is still taken, a header just short of the
  64 KiB the hook reads, of ``#`` lines then the directive, or of ``#SBATCH`` lines.

Figures: ``<script>_<release>_p99_ms`` each, ``submit_hook_worst_p99_ms`` (the largest
of the hostile ones) and ``submit_hook_worst_extra_ms`` (that less the normal script's
p99 on the same release; goal: a few milliseconds). ``--template``: time another
burst_buffer.lua.in (``git show REV:slurm-conf/templates/burst_buffer.lua.in``), for a
before-and-after.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_burst.config import load_config  # noqa: E402
from slurm_burst.core.staging import MAX_HEADER  # noqa: E402
from slurm_burst.services import burstbuffer  # noqa: E402
from slurm_burst.services.slurmconf import render  # noqa: E402

MIB = 1024 * 1024
FULL = MAX_HEADER - 200  # a header the hook still takes whole
HEAD = "#!/bin/bash\n#SBATCH -p burst-gpu\n#BB_LUA stage_in src=/data/set/train dst=set\n"


def scripts() -> dict[str, str]:
    """The scripts timed, each at most the megabyte the hook reads (MAX_SCRIPT)."""
    words = " w" * (MIB // 2)
    return {
        "normal": "#!/bin/bash\n#SBATCH -p burst-gpu\n#SBATCH -N 4 --gres=gpu:2\n"
        + "".join(f"#BB_LUA stage_in src=/data/set-{i}/train dst=set{i}\n" for i in range(4))
        + "srun python train.py\n" * 2000,
        "comment_lines": HEAD + "#\n" * (MIB // 2) + "srun true\n",
        "comment_words": HEAD + "#" + words + "\nsrun true\n",
        "sbatch_lines": "#!/bin/bash\n#BB_LUA stage_in src=/data/set/train dst=set\n"
        + "#SBATCH -p burst-gpu\n" * (MIB // 21) + "srun true\n",
        "directive_words": "#!/bin/bash\n#SBATCH -p burst-gpu\n#BB_LUA stage_in" + words + "\n",
        "late_directive": "#!/bin/bash\n#SBATCH -p burst-gpu\n" + "#\n" * (MIB // 2 - 64)
        + "#BB_LUA stage_in src=/data/set/train dst=set\nsrun true\n",
        "full_header": "#!/bin/bash\n#SBATCH -p burst-gpu\n" + "#\n" * (FULL // 2)
        + "#BB_LUA stage_in src=/data/set/train dst=set\nsrun true\n",
        "full_sbatch": "#!/bin/bash\n#BB_LUA stage_in src=/data/set/train dst=set\n"
        + "#SBATCH -p burst-gpu\n" * (FULL // 21) + "srun true\n",
    }  # fmt: skip


def time_calls(lua: str, hook: Path, job: Path, calls: int, args: list[str]) -> float:
    harness = ROOT / "tests" / "lua" / "harness.lua"
    said = subprocess.run(
        [lua, str(harness), str(hook), "time", str(job), str(calls), *args],
        capture_output=True, text=True, check=True, timeout=1800,
    ).stdout.split()  # fmt: skip
    return float(said[1])  # p99


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--quick", action="store_true", help="20 calls a script, not 200")
    ap.add_argument("--template", type=Path, help="another burst_buffer.lua.in to time")
    args = ap.parse_args()
    lua = shutil.which("lua5.1")
    if lua is None:
        print(json.dumps({"not_measured": ["submit_hook (no lua5.1)"]}))
        return
    calls = 20 if args.quick else 200
    cfg = load_config(ROOT / "slurm-conf" / "lab" / "slurm-burst.toml")
    out: dict[str, Any] = {"calls": calls, "template": str(args.template or "current")}
    with tempfile.TemporaryDirectory(prefix="sb-submit-hook-") as tmp:
        hook = Path(tmp) / "burst_buffer.lua"
        if args.template:
            hook.write_text(burstbuffer.render_lua(cfg, args.template.read_text()))
        else:
            hook.write_text(render(cfg, "24.11")["burst_buffer.lua"])
        shapes = {"22.05": [], "26.05": ["burst-gpu", "physics", "normal"]}
        for name, text in scripts().items():
            job = Path(tmp) / f"{name}.sh"
            job.write_text(text)
            for release, shape in shapes.items():
                p99 = time_calls(lua, hook, job, calls, shape)
                out[f"{name}_{release}_p99_ms"] = round(p99, 3)
                if not args.json:
                    print(f"{name:>16} {release}: p99 {p99:9.3f} ms", file=sys.stderr)
    hostile = [k for k in out if k.endswith("_p99_ms") and not k.startswith("normal_")]
    worst = max(hostile, key=lambda k: out[k])
    release = worst.split("_")[-3]
    out["submit_hook_worst_p99_ms"] = out[worst]
    out["submit_hook_worst_script"] = worst.removesuffix("_p99_ms")
    out["submit_hook_worst_extra_ms"] = round(out[worst] - out[f"normal_{release}_p99_ms"], 3)
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
