"""Staging figures (issue 29): ``python benchmarks/staging.py [--json] [--quick]``.

- ``restage_*``: a second push of an unchanged 10,000-file, 160 MiB tree: seconds,
  bytes sent, requests (goal <= 1 s, 0 bytes, <= 3 requests); against ``rclone serve
  s3`` on loopback.
- ``corrupt_files_seen`` of ``trials``: objects corrupted at the fetch layer (a byte
  flipped, cut short, grown, swapped for another object, a compressed stream broken or
  inflating past its size), each fetched by the node's puller: how many it accepted
  (goal 0).
- ``throughput_ratio_vs_rclone``: the smallest of four ratios over a 200 Mbit/s link
  (tc tbf on a veth into a network namespace of our own that runs the S3 server), 2 GiB
  as 512 files of 4 MiB and as one file: the push (hash, send) against ``rclone copy``
  up, and the node's pull (fetch, verify, rename) against ``rclone copy`` down (root;
  goal >= 0.9). ``--quick``: 256 MiB instead of 2 GiB.

- ``ledger_bytes_error_ratio``: those pushes and pulls recorded in a real ledger as the
  daemon records them; the ledger's bytes against the veth's interface counters (goal
  <= 0.02).
- ``stageout_ratio_vs_rclone`` (issue 30): the smaller of two ratios over the same link,
  1 GiB of outputs as 512 files: the node's sync (scan, presigned PUTs) against
  ``rclone copy`` up, and the promotion home (fetch, verify, swap in) against ``rclone
  copy`` down (goal >= 0.9); ``seal_s``: both, what a node's release waits for after its
  job ends; ``checkpoint_sync_overhead``: a job's work lost to a sync every 5 s of a
  64 MiB checkpoint it rewrites each time. ``--quick``: 256 MiB.
- ``submit_hook_p99_ms``: burst_buffer.lua's job_process in Lua 5.1 (goal <= 5 ms).

The pre-staged sbatch-to-RUNNING needs the lab: ``benchmarks/prestaged.py`` (root, no
lab of yours up). Figures not measured are null and listed in ``not_measured``. With
``--burners`` two CPU burners run beside every measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import http.server
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_burst.adapters.clock import SystemClock  # noqa: E402
from slurm_burst.adapters.storage.home import LocalHome  # noqa: E402
from slurm_burst.adapters.storage.s3 import S3Store  # noqa: E402
from slurm_burst.adapters.storage.tree import LocalTree  # noqa: E402
from slurm_burst.config import load_config  # noqa: E402
from slurm_burst.core.staging import output_manifest  # noqa: E402
from slurm_burst.node import stagein, stageout  # noqa: E402
from slurm_burst.services.slurmconf import render  # noqa: E402
from slurm_burst.services.staging import Stager, StagingSettings  # noqa: E402
from tests.s3server import KEY, SECRET, free_port, rclone, s3_server  # noqa: E402

NETNS, HOST_IF, NS_IF = "sbbench-s3", "sbb-h0", "sbb-n0"
HOST_IP, NS_IP = "10.252.99.1", "10.252.99.2"


def stager(endpoint: str, prefix: str = "bench/", transfers: int = 4) -> Stager:
    store = S3Store(
        "bench",
        bucket="stage",
        region="us-east-1",
        keys={"key": KEY, "secret": SECRET},
        endpoint=endpoint,
        secure=False,
    )
    settings = StagingSettings(prefix=prefix, transfers=transfers)
    return Stager(settings=settings, store=store, tree=LocalTree(), clock=SystemClock())


def write_tree(root: Path, files: int, size: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    block = os.urandom(size)
    for i in range(files):
        sub = root / f"d{i % 100:02d}"
        sub.mkdir(exist_ok=True)
        # distinct bytes per file (else dedup sends one object), cheaply
        (sub / f"f{i:05d}").write_bytes(i.to_bytes(8, "big") + block[8:])


def bench_restage(tmp: Path) -> dict[str, Any]:
    tree = tmp / "tree"
    write_tree(tree, 10_000, 16 * 1024)
    with s3_server(tmp / "s3") as srv:
        st = stager(srv.endpoint)
        first = st.push(str(tree), "bench")
        again = [stager(srv.endpoint).push(str(tree), "bench") for _ in range(3)]
    best = min(again, key=lambda p: p.seconds)
    return {
        "restage_files": first.files,
        "restage_tree_bytes": first.bytes,
        "first_push_s": first.seconds,
        "restage_unchanged_s": best.seconds,
        "restage_unchanged_s_runs": [p.seconds for p in again],
        "restage_bytes_sent": max(p.bytes_sent for p in again),
        "restage_requests": max(p.requests for p in again),
    }


# -- corrupted fetches ----------------------------------------------------------------


def _corruptions(
    rng: random.Random, data: bytes, zipped: bytes, other: bytes
) -> Iterator[tuple[str, bytes, str]]:
    """(kind, bytes served, encoding the plan says)."""
    while True:
        kind = rng.choice(["flip", "cut", "grow", "swap", "zflip", "zcut", "zbomb"])
        if kind == "flip":
            b = bytearray(data)
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            yield kind, bytes(b), ""
        elif kind == "cut":
            yield kind, data[: rng.randrange(len(data))], ""
        elif kind == "grow":
            yield kind, data + os.urandom(rng.randrange(1, 64)), ""
        elif kind == "swap":
            yield kind, other, ""
        elif kind == "zflip":
            b = bytearray(zipped)
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            yield kind, bytes(b), "zlib"
        elif kind == "zcut":
            yield kind, zipped[: rng.randrange(len(zipped))], "zlib"
        else:  # a stream that inflates far past the file's size
            yield kind, zlib.compress(b"\0" * (64 * len(data)), 9), "zlib"


def bench_corrupt(tmp: Path, trials: int) -> dict[str, Any]:
    rng = random.Random(29)
    data = b"".join(b"row %d, value %d\n" % (i, i * 7) for i in range(4000))
    zipped, other = zlib.compress(data, 1), os.urandom(len(data))
    served: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = served.get(self.path, b"")
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sha = hashlib.sha256(data).hexdigest()
    plan = {"dest": str(tmp / "d"), "manifest": "0" * 64, "uid": 0, "gid": 0, "files": []}
    puller = stagein.Puller(plan, retries=0, timeout=5, parallel=1)
    accepted, kinds = 0, dict[str, int]()
    gen = _corruptions(rng, data, zipped, other)
    try:
        for i in range(trials):
            kind, body, enc = next(gen)
            served[f"/o{i}"] = body
            kinds[kind] = kinds.get(kind, 0) + 1
            f = {
                "path": f"f{i}",
                "size": len(data),
                "sha256": sha,
                "encoding": enc,
                "executable": False,
                "url": f"http://127.0.0.1:{server.server_port}/o{i}",
            }
            tmpfile = tmp / f"t{i}"
            try:
                puller._fetch(f, str(tmpfile))
            except (stagein.Corrupt, zlib.error, OSError):
                continue
            finally:
                served.pop(f"/o{i}", None)
            if tmpfile.read_bytes() != data:
                accepted += 1
            tmpfile.unlink()
    finally:
        server.shutdown()
    return {"corrupt_files_seen": accepted, "trials": trials, "corruptions": kinds}


# -- throughput through a shaped link --------------------------------------------------


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def shaped_link(mbit: int) -> Iterator[None]:
    """A network namespace reached over a veth shaped to ``mbit`` each way."""
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True, check=False)
    _ip("netns", "add", NETNS)
    try:
        _ip("link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF)
        _ip("link", "set", NS_IF, "netns", NETNS)
        _ip("addr", "add", f"{HOST_IP}/30", "dev", HOST_IF)
        _ip("link", "set", HOST_IF, "up")
        _ip("-n", NETNS, "addr", "add", f"{NS_IP}/30", "dev", NS_IF)
        _ip("-n", NETNS, "link", "set", NS_IF, "up")
        _ip("-n", NETNS, "link", "set", "lo", "up")
        for ns, dev in (([], HOST_IF), (["-n", NETNS], NS_IF)):
            subprocess.run(
                [
                    "tc",
                    *ns,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    f"{mbit}mbit",
                    "burst",
                    "256kb",
                    "latency",
                    "50ms",
                ],
                check=True,
            )
        yield
    finally:
        subprocess.run(["ip", "link", "del", HOST_IF], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True, check=False)


@contextlib.contextmanager
def server_in_netns(root: Path) -> Iterator[str]:
    (root / "stage").mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [
        "ip",
        "netns",
        "exec",
        NETNS,
        rclone(),
        "serve",
        "s3",
        "--auth-key",
        f"{KEY},{SECRET}",
        "--addr",
        f"{NS_IP}:{port}",
        "--log-level",
        "ERROR",
        str(root),
    ]
    proc = subprocess.Popen(cmd, env={**os.environ, "RCLONE_CONFIG": "/dev/null"})
    try:
        for _ in range(200):
            with contextlib.suppress(OSError):
                import socket

                socket.create_connection((NS_IP, port), timeout=0.2).close()
                break
            time.sleep(0.05)
        yield f"{NS_IP}:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def rclone_copy(src: str, endpoint: str, dest: str) -> float:
    env = {
        **os.environ,
        "RCLONE_CONFIG": "/dev/null",
        "RCLONE_S3_PROVIDER": "Other",
        "RCLONE_S3_ENDPOINT": f"http://{endpoint}",
        "RCLONE_S3_ACCESS_KEY_ID": KEY,
        "RCLONE_S3_SECRET_ACCESS_KEY": SECRET,
        "RCLONE_S3_REGION": "us-east-1",
    }
    t = time.perf_counter()
    subprocess.run([rclone(), "copy", src, dest], env=env, check=True)
    return time.perf_counter() - t


def _counter(dev: str, which: str) -> int:
    return int(Path(f"/sys/class/net/{dev}/statistics/{which}_bytes").read_text())


def _ledger(tmp: Path) -> tuple[Any, Any]:
    """A real SQL ledger (SQLite) and the transfer book the daemon would use on it."""
    from slurm_burst.adapters.ledger.sql import SqlLedger
    from slurm_burst.services.transfers import StorePrices, TransferBook

    led = SqlLedger(f"sqlite:///{tmp}/ledger.db", "bench", check_schema=False)
    led.upgrade()
    prices = StorePrices(store="bench", upload_per_gb=0.0, storage_per_gb_month=0.023)
    return led, TransferBook("bench", prices, SystemClock(), led)


def bench_throughput(tmp: Path, total: int, mbit: int) -> dict[str, Any]:
    """Also ``ledger_bytes_error_ratio``: every push and pull recorded in a real ledger as
    the daemon records them, the ledger's bytes against the link's interface counters
    (the host's side of the veth: sent for pushes, received for pulls)."""
    led, book = _ledger(tmp)
    wire = {"in": 0, "pull": 0}
    many, one = tmp / "many", tmp / "one"
    write_tree(many, 512, total // 512)
    one.mkdir()
    with open(one / "big", "wb") as fh:
        for _ in range(total // (4 << 20)):
            fh.write(os.urandom(4 << 20))
    out: dict[str, Any] = {"link_mbit": mbit, "bytes": total}
    with shaped_link(mbit), server_in_netns(tmp / "s3") as endpoint:
        for name, src in (("512_files", many), ("one_file", one)):
            st = stager(endpoint, prefix=f"{name}/")
            tx = _counter(HOST_IF, "tx")
            ours = st.push(str(src), "bench")
            wire["in"] += _counter(HOST_IF, "tx") - tx
            book.pushed(ours.as_dict(), account="bench", user="bench", job_id=1, dst=name)
            theirs = rclone_copy(str(src), endpoint, f":s3:stage/rclone-{name}")
            out[f"push_{name}"] = _pair(total, ours.seconds, theirs)
            # the node's side: the pull (verify, rename) against rclone copy down
            manifest = st.manifest("bench", str(src))
            assert manifest is not None
            plan = st.node_plan("bench", manifest, str(tmp / "node" / name), 0, 0)
            t, rx = time.perf_counter(), _counter(HOST_IF, "rx")
            said = stagein.Puller(plan, retries=3, timeout=60, parallel=4).run()
            pulled = time.perf_counter() - t
            wire["pull"] += _counter(HOST_IF, "rx") - rx
            book.pulled(said, account="bench", user="bench", job_id=1, dst=name, node="bench",
                        provider="", manifest=manifest.id)  # fmt: skip
            theirs = rclone_copy(f":s3:stage/rclone-{name}", endpoint, str(tmp / "rc" / name))
            out[f"pull_{name}"] = _pair(total, pulled, theirs)
            shutil.rmtree(tmp / "node" / name, ignore_errors=True)
            shutil.rmtree(tmp / "rc" / name, ignore_errors=True)
    keys = [k for k in out if k.startswith(("push_", "pull_"))]
    out["throughput_ratio_vs_rclone"] = min(out[k]["ratio"] for k in keys)
    day = time.gmtime()
    start = datetime.date(day.tm_year, day.tm_mon, day.tm_mday)
    rows = led.transfers(start, start + datetime.timedelta(days=2))
    booked = {d: sum(r["bytes_sent"] for r in rows if r["direction"] == d) for d in wire}
    out["ledger_bytes"] = booked
    out["interface_bytes"] = wire
    out["ledger_bytes_error_ratio"] = round(
        max(abs(booked[d] - wire[d]) / wire[d] for d in wire if wire[d]), 4
    )
    return out


def _node_sync(st: Stager, out_dir: Path, home: str, cache: Path) -> dict[str, Any]:
    """One stage-out sync as the daemon drives it (the node program in-process): scan,
    ask the store what it lacks, send with presigned PUTs, record the version."""
    scanner = stageout.Scanner(str(out_dir), stageout._read_cache(str(cache)))
    scan = scanner.run()
    stageout._write_cache(str(cache), scanner.seen)
    manifest = output_manifest(home, scan["files"], "bench")
    plan, _ = st.output_plan("bench", manifest, str(out_dir))
    sent = stageout.Sender(stageout.load_plan(json.dumps(plan).encode()), 60, 4).run()
    assert sent["ok"] and not sent["changed"], sent
    st.commit("bench", manifest)
    return {"manifest": manifest.id, "hashed": scan["hashed_bytes"], "sent": sent["sent_bytes"]}


def bench_stageout(tmp: Path, total: int, mbit: int) -> dict[str, Any]:
    """Stage-out through the same shaped link: the node's final sync (scan, send) against
    ``rclone copy`` up, and the promotion home (fetch, verify, swap in) against ``rclone
    copy`` down; ``seal_s``: the two together, what a node's release waits for after its
    job ends (Slurm's SuspendTime runs meanwhile). Then ``checkpoint_sync_overhead``: a
    one-thread job's work lost to a sync every 5 s of its directory, where it rewrites a
    64 MiB checkpoint before each (the job's rate with syncs against without)."""
    out_dir, home_root = tmp / "node" / "out", tmp / "home"
    write_tree(out_dir, 512, total // 512)
    home_root.mkdir(parents=True)
    out: dict[str, Any] = {}
    with shaped_link(mbit), server_in_netns(tmp / "s3") as endpoint:
        st = stager(endpoint, prefix="out/")
        st.home = LocalHome()
        t = time.perf_counter()
        synced = _node_sync(st, out_dir, str(home_root / "1"), tmp / "cache.json")
        sync_s = time.perf_counter() - t
        theirs_up = rclone_copy(str(out_dir), endpoint, ":s3:stage/rclone-out")
        t = time.perf_counter()
        st.promote("bench", synced["manifest"], str(home_root / "1"))
        promote_s = time.perf_counter() - t
        theirs_down = rclone_copy(":s3:stage/rclone-out", endpoint, str(tmp / "rc-out"))
        out["stageout_sync"] = _pair(total, sync_s, theirs_up)
        out["stageout_promote"] = _pair(total, promote_s, theirs_down)
        out["stageout_ratio_vs_rclone"] = min(out["stageout_sync"]["ratio"],
                                              out["stageout_promote"]["ratio"])  # fmt: skip
        out["seal_s"] = round(sync_s + promote_s, 3)
        out["seal_bytes"] = total
        out["checkpoint_sync_overhead"] = _sync_overhead(st, tmp / "ckpt", 30.0)
    return out


def _spin(seconds: float, done: Any) -> None:
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        n += sum(i * i for i in range(1000)) > 0
    done.value = n


def _sync_overhead(st: Stager, out_dir: Path, seconds: float) -> float:
    """1 - (a job's work with a sync every 5 s) / (without)."""
    out_dir.mkdir(parents=True)
    rates = []
    for syncing in (False, True):
        done = multiprocessing.Value("q", 0)
        job = multiprocessing.Process(target=_spin, args=(seconds, done))
        job.start()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            (out_dir / "model.pt.tmp").write_bytes(os.urandom(64 << 20))
            os.replace(out_dir / "model.pt.tmp", out_dir / "model.pt")
            if syncing:
                _node_sync(st, out_dir, "/home/ckpt", out_dir.parent / "ckpt-cache.json")
            time.sleep(max(0.0, min(5.0, end - time.perf_counter())))
        job.join()
        rates.append(done.value)
    return round(1 - float(rates[1]) / float(rates[0]), 4)


def _pair(total: int, ours: float, theirs: float) -> dict[str, float]:
    return {
        "slurm_burst_s": round(ours, 3),
        "slurm_burst_mbit_s": round(total * 8 / ours / 1e6, 1),
        "rclone_s": round(theirs, 3),
        "rclone_mbit_s": round(total * 8 / theirs / 1e6, 1),
        "ratio": round(theirs / ours, 3),
    }


def bench_submit_hook(tmp: Path, calls: int = 10000) -> dict[str, Any]:
    """burst_buffer.lua's job_process, rendered from the lab's config, run by Lua 5.1 on
    a script of four directives and a 2,000-line body (the header is all it reads)."""
    lua = shutil.which("lua5.1")
    if lua is None:
        return {"submit_hook_p99_ms": None}
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = load_config(ROOT / "slurm-conf" / "lab" / "slurm-burst.toml")
    script = tmp / "burst_buffer.lua"
    script.write_text(render(cfg, "24.11")["burst_buffer.lua"])
    job = tmp / "job.sh"
    job.write_text(
        "#!/bin/bash\n#SBATCH -p burst-gpu\n#SBATCH -N 4 --gres=gpu:2\n"
        + "".join(f"#BB_LUA stage_in src=/data/set-{i}/train dst=set{i}\n" for i in range(4))
        + "srun python train.py\n" * 2000
    )
    harness = ROOT / "tests" / "lua" / "harness.lua"
    said = subprocess.run(
        [lua, str(harness), str(script), "time", str(job), str(calls), "burst-gpu", "physics",
         "normal"], capture_output=True, text=True, check=True, timeout=600,
    ).stdout.split()  # fmt: skip
    p50, p99, worst = (float(x) for x in said)
    return {"submit_hook_p50_ms": p50, "submit_hook_p99_ms": p99, "submit_hook_max_ms": worst,
            "submit_hook_calls": calls}  # fmt: skip


def _burn(stop: Any) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10000))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--quick", action="store_true", help="256 MiB through the link, not 2 GiB")
    ap.add_argument("--burners", action="store_true", help="two CPU burners alongside")
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--link-only", action="store_true", help="only the shaped-link figures")
    args = ap.parse_args()
    stop = multiprocessing.Event()
    burners = [
        multiprocessing.Process(target=_burn, args=(stop,)) for _ in range(2 if args.burners else 0)
    ]
    for b in burners:
        b.start()
    out: dict[str, Any] = {"cpus": os.cpu_count(), "burners": len(burners)}
    tmp = Path(tempfile.mkdtemp(prefix="sb-stagebench-"))
    try:
        if not args.link_only:
            out.update(bench_submit_hook(tmp / "lua"))
            out.update(bench_restage(tmp / "restage"))
            out.update(bench_corrupt(tmp / "corrupt", args.trials))
        if os.geteuid() == 0 and shutil.which("tc"):
            out.update(bench_throughput(tmp / "link", (256 if args.quick else 2048) << 20, 200))
            out.update(bench_stageout(tmp / "out", (256 if args.quick else 1024) << 20, 200))
        else:
            out["throughput_ratio_vs_rclone"] = None
            out["stageout_ratio_vs_rclone"] = None
        out.setdefault("ledger_bytes_error_ratio", None)
        out["prestaged_sbatch_to_running_minus_boot_pull_s"] = None
        out["not_measured"] = [k for k, v in out.items() if v is None]
    finally:
        stop.set()
        for b in burners:
            b.join()
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        for k, v in sorted(out.items()):
            print(f"{k:<48} {v}")


if __name__ == "__main__":
    main()
