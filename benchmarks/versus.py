"""Side by side with aws-plugin-for-slurm (its plugin-v2 branch): a resume of 1,000 nodes
of one group on the project's EC2 emulator, slurm-burst and the plugin taking turns, a
fresh emulator each run, on a quiet machine and with two CPU burners beside both.

slurm-burst: the resume hook (a new process, as Slurm runs it) and the daemon's real
request, launch and naming path (this process; boot and join are not run: nothing boots
in an emulator). The plugin: its own ``resume.py`` run as Slurm runs it, against the
same emulator through boto3 (``AWS_ENDPOINT_URL_EC2``), with a launch template and
subnet made for it beforehand (not counted) and an ``scontrol`` on its ``SlurmBinPath``
that expands hostlists and answers ``update`` at once (a real one asks slurmctld: the
plugin's figures here are its best case). Its log level is WARNING (least logging).

Figures per run: the first EC2 call after the hook; **all instances requested**
(slurm-burst: every node's instance recorded in its state; the plugin: its CreateFleet
answered, marked by a boto3 event hook in its process); every instance named (its
``Name`` tag: the plugin's last CreateTags, after which it sets the node's address in
Slurm; slurm-burst names each instance in the background up to
``daemon.name_each_max``, a larger launch at launch); EC2 calls in all (slurm-burst's
over at least 15 s: its listings and reconcile passes after the launch count) and
throttled answers. Two emulators: without throttling (as the issue's comparison), and
one run each with EC2's documented buckets.

    python benchmarks/versus.py --plugin DIR [--nodes 1000] [--runs 3]

DIR is a checkout of https://github.com/aws-samples/aws-plugin-for-slurm at its
``plugin-v2`` branch (``resume.py`` and ``common.py``). Nothing of the plugin is in this
repository; without DIR the comparison says so and is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launch import burners, launching, resume  # noqa: E402
from slurm_burst_lab.ec2emu import RemoteEmulator, Scale  # noqa: E402

SETTLE_S = 15.0
KEY, SECRET = "AKIDEMULATOR000000000", "emulator-secret"
# the plugin's node names: partition-nodegroup-index
PARTITION, GROUP = "burst", "cpu"

# scontrol for the plugin: hostlists expanded by slurm-burst's own expander (no
# slurmctld here), an update answered at once and noted
SCONTROL = """#!/bin/sh
if [ "$1" = show ] && [ "$2" = hostnames ]; then
    exec {python} -c 'import sys; sys.path.insert(0, "{root}")
from slurm_burst.core.hostlist import expand
print("\\n".join(expand(sys.argv[1])))' "$3"
fi
echo "$*" >> {updates}
"""

# runs the plugin's resume.py unchanged; notes when its CreateFleet was answered
RUNNER = """import runpy, sys, time, boto3
boto3.setup_default_session()
def answered(**kw):
    sys.stderr.write("VERSUS-FLEET-ANSWERED %.6f\\n" % time.monotonic())
boto3.DEFAULT_SESSION.events.register("after-call.ec2.CreateFleet", answered)
sys.argv = ["resume.py", sys.argv[1]]
runpy.run_path("resume.py", run_name="__main__")
"""


def plugin_run(emu: RemoteEmulator, plugin: Path, nodes: int) -> dict[str, Any]:
    """The plugin's resume of ``nodes`` nodes against ``emu``."""
    import boto3  # type: ignore[import-untyped]

    env = {
        **os.environ,
        "AWS_ENDPOINT_URL_EC2": f"http://127.0.0.1:{emu.port}",
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    ec2 = boto3.client(
        "ec2", endpoint_url=env["AWS_ENDPOINT_URL_EC2"], region_name="us-east-1",
        aws_access_key_id=KEY, aws_secret_access_key=SECRET,
    )  # fmt: skip
    template = f"versus-{time.time_ns()}"
    ec2.create_launch_template(
        LaunchTemplateName=template,
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "c5.large"},
    )
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    with tempfile.TemporaryDirectory() as d:
        home = Path(d)
        for f in ("resume.py", "common.py"):
            shutil.copy(plugin / f, home / f)
        (home / "bin").mkdir()
        updates = home / "updates"
        scontrol = home / "bin" / "scontrol"
        scontrol.write_text(SCONTROL.format(python=sys.executable, root=ROOT, updates=updates))
        scontrol.chmod(0o755)
        slurm_conf: dict[str, str | int] = {
            k: "x" for k in ("PrivateData", "ResumeProgram", "SuspendProgram")
        }
        slurm_conf |= {"ResumeRate": 0, "SuspendRate": 0, "ResumeTimeout": 600,
                       "SuspendTime": 300, "TreeWidth": 60000}  # fmt: skip
        (home / "config.json").write_text(json.dumps({
            "LogLevel": "WARNING", "LogFileName": str(home / "plugin.log"),
            "SlurmBinPath": str(home / "bin"), "SlurmConf": slurm_conf,
        }))  # fmt: skip
        group = {
            "NodeGroupName": GROUP, "MaxNodes": nodes, "Region": "us-east-1",
            "SlurmSpecifications": {}, "PurchasingOption": "on-demand",
            "LaunchTemplateSpecification": {"LaunchTemplateName": template, "Version": "$Latest"},
            "LaunchTemplateOverrides": [{"InstanceType": "c5.large"}], "SubnetIds": [subnet],
        }  # fmt: skip
        (home / "partitions.json").write_text(json.dumps(
            {"Partitions": [{"PartitionName": PARTITION, "NodeGroups": [group]}]}))  # fmt: skip
        (home / "runner.py").write_text(RUNNER)
        emu.clear()
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "runner.py", f"{PARTITION}-{GROUP}-[0-{nodes - 1}]"],
            cwd=home, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        ended = time.monotonic()
        marks = [line.split()[1] for line in proc.stderr.splitlines()
                 if line.startswith("VERSUS-FLEET-ANSWERED")]  # fmt: skip
        addressed = len(updates.read_text().splitlines()) if updates.exists() else 0
    seen = emu.timeline()
    line = [(t - started, a, thr) for t, a, thr in seen["timeline"]]
    return {
        "first_call_s": _first(line),
        "requested_s": float(marks[0]) - started if marks else None,
        "named_s": _last_named(line),
        "done_s": ended - started,
        "calls": len(line),
        "throttled": int(seen["throttled"]),
        "named": sum(1 for _, a, thr in line if a == "CreateTags" and not thr),
        "addressed_in_slurm": addressed,
        "exit": proc.returncode,
    }


def ours_run(emu: RemoteEmulator, nodes: int) -> dict[str, Any]:
    """slurm-burst's resume of ``nodes`` nodes against ``emu``: the hook, the daemon's
    launch and naming."""
    with (
        tempfile.TemporaryDirectory() as d,
        launching(emu, Path(d), nodes, 0) as (
            cfg,
            store,
            _,
        ),
    ):
        started = time.monotonic()
        resume(cfg, nodes)
        requested = None
        # named one by one (in the background) up to daemon.name_each_max; a larger
        # launch is named by RunInstances itself
        to_name = nodes if nodes <= cfg.daemon.name_each_max else 0
        deadline = started + 900
        while time.monotonic() < deadline:
            if requested is None and sum(1 for r in store.nodes() if r.instance_id) >= nodes:
                requested = time.monotonic() - started
            if requested is not None:
                line = emu.timeline()["timeline"]
                if sum(1 for _, a, thr in line if a == "CreateTags" and not thr) >= to_name:
                    break
                time.sleep(0.5)
            else:
                time.sleep(0.02)
        # the calls over at least SETTLE_S (the plugin's whole run is about 10 s): the
        # daemon's listings and reconcile passes after the launch count too
        time.sleep(max(0.0, started + SETTLE_S - time.monotonic()))
    seen = emu.timeline()
    line = [(t - started, a, thr) for t, a, thr in seen["timeline"]]
    return {
        "first_call_s": _first(line),
        "requested_s": requested,
        "named_s": _last_named(line) if to_name else requested,
        "calls": len(line),
        "throttled": int(seen["throttled"]),
        "named": sum(1 for _, a, thr in line if a == "CreateTags" and not thr),
    }


def _first(line: list[tuple[float, str, bool]]) -> float | None:
    """The first call after the hook (the daemon's start-up calls come before it)."""
    after = [t for t, _, _ in line if t >= 0]
    return round(min(after), 3) if after else None


def _last_named(line: list[tuple[float, str, bool]]) -> float | None:
    named = [t for t, a, thr in line if a == "CreateTags" and not thr]
    return round(max(named), 2) if named else None


def fresh(who: str, nodes: int, throttle: float, plugin: Path) -> dict[str, Any]:
    emu = RemoteEmulator(Scale(throttle, 60.0, 30.0))
    try:
        r = plugin_run(emu, plugin, nodes) if who == "plugin" else ours_run(emu, nodes)
    finally:
        emu.stop()
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in runs[0]:
        vals = [r[k] for r in runs if isinstance(r[k], (int, float))]
        if vals:
            out[k] = round(statistics.median(vals), 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plugin", type=Path, default=os.environ.get("AWS_PLUGIN_FOR_SLURM"),
                    help="a checkout of aws-plugin-for-slurm, branch plugin-v2")  # fmt: skip
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.plugin is None or not (Path(args.plugin) / "resume.py").is_file():
        print("versus aws-plugin-for-slurm: skipped (no --plugin DIR, a checkout of its "
              "plugin-v2 branch, or AWS_PLUGIN_FOR_SLURM)")  # fmt: skip
        return
    os.environ.setdefault("SB_TEST_AWS_KEY", KEY)
    os.environ.setdefault("SB_TEST_AWS_SECRET", SECRET)
    result: dict[str, Any] = {"nodes": args.nodes, "runs": args.runs}
    for load in (0, 2):
        with burners(load):
            runs: dict[str, list[dict[str, Any]]] = {"slurm-burst": [], "plugin": []}
            for i in range(args.runs):  # taking turns
                for who in ("slurm-burst", "plugin") if i % 2 == 0 else ("plugin", "slurm-burst"):
                    r = fresh(who, args.nodes, 0.0, args.plugin)
                    runs[who].append(r)
                    print(f"  no throttling, {load} burners, {who:<11} run {i + 1}: {r}",
                          file=sys.stderr)  # fmt: skip
            result[f"no_throttling_{load}_burners"] = {
                who: {"median": summary(rs), "runs": rs} for who, rs in runs.items()
            }
    throttled = {}
    for who in ("slurm-burst", "plugin"):
        throttled[who] = fresh(who, args.nodes, 1.0, args.plugin)
        print(f"  EC2's buckets, {who:<11}: {throttled[who]}", file=sys.stderr)
    result["ec2_buckets_0_burners"] = throttled
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"resume of {args.nodes} nodes: slurm-burst against aws-plugin-for-slurm "
          f"(plugin-v2), medians of {args.runs} runs taking turns")  # fmt: skip
    for key, table in result.items():
        if not isinstance(table, dict):
            continue
        print(f"  {key}")
        for who, r in table.items():
            row = r.get("median", r)
            print(f"    {who:<12} " + "  ".join(f"{k} {v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
