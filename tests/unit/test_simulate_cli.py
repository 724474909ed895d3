"""``slurm-burst simulate`` end to end on small traces: the table and --json, the
baselines and the sweep, and what it says about input it cannot use (exit 2)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from tests.conftest import invoke
from tests.unit.test_config import GOOD, write

# 4 CPUs; a 4-CPU job holds them for 10,000 s; two 4-CPU jobs of an hour arrive behind it
SWF = "; MaxProcs: 4\n" + "".join(
    f"{i} {submit} 0 {run} 4 -1 -1 4 {run} -1 1 1 1 1 1 -1 -1 -1\n"
    for i, (submit, run) in enumerate([(0, 10_000), (1, 3600), (2, 3600)], start=1)
)


CPU_GROUP = """
[node_groups.cpu]
pattern = "cpu-{n:02d}"
count = 4
partition = "burst-cpu"
providers = ["aws"]
sizes = ["c6i.xlarge"]
image = "ami-123"
cpus = 4
memory_mb = 7000
price_per_hour = { "c6i.xlarge" = 0.19 }
"""


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    return write(tmp_path, GOOD + CPU_GROUP)  # CPU jobs burst on CPU nodes, never GPU ones


def test_the_baselines_and_the_policy(cfg: Path, tmp_path: Path) -> None:
    trace = tmp_path / "t.swf.gz"
    trace.write_bytes(gzip.compress(SWF.encode()))
    r = invoke(
        ["--config", str(cfg), "simulate", "--trace", str(trace), "--sweep", "100000", "--json"]
    )
    doc = json.loads(r.stdout)
    assert doc["onprem"] == {"cpus": 4, "gpus": 0} and doc["trace"]["jobs"] == 3
    p = doc["policies"]
    assert set(p) == {"never", "always", "policy", "wait_per_dollar=100000"}
    assert p["never"]["burst_jobs"] == 0 and p["never"]["cloud_cost"] == 0
    assert p["always"]["burst_jobs"] == 2 and p["always"]["wait_cut"] == 1
    # each would wait 2.8 h or more on-prem, over the 12 min an hour a dollar gives $0.20
    assert p["policy"]["burst_jobs"] == 2
    assert p["wait_per_dollar=100000"]["burst_jobs"] == 0  # 5.5 h: they wait instead
    prices = {g["name"]: g["price_per_hour"] for g in doc["cloud"]}
    assert prices == {"gpu": pytest.approx(1.006), "cpu": pytest.approx(0.19)}
    table = invoke(["--config", str(cfg), "simulate", "--trace", str(trace)]).stdout
    assert "POLICY" in table and "always" in table


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        (SWF, ["--sweep", "x"], "--sweep 'x'"),
        (SWF, ["--sweep", "inf"], "between 0 and 1e9"),
        ("1 2 3\n", ["--cpus", "4"], "line 1: 3 fields"),
        (SWF.replace("; MaxProcs: 4\n", ""), [], "--cpus is needed"),
        ("hello\n", [], "cannot tell the trace's format"),
        (b"\x1f\x8b\x08garbage", [], "cannot read it"),
        (b"\xff\xfe\x00", [], "not UTF-8"),
        ("; only a header\n", [], "no job that ran"),
        (SWF, ["--limit-factor", "nan"], "not a finite number"),
    ],
    ids=[
        "sweep-word",
        "sweep-inf",
        "fields",
        "no-pool",
        "format",
        "bad-gzip",
        "binary",
        "empty",
        "limit-factor-nan",
    ],
)
def test_bad_input_is_named_and_exits_2(
    cfg: Path, tmp_path: Path, content: str | bytes, args: list[str], message: str
) -> None:
    trace = tmp_path / "t"
    trace.write_bytes(content.encode() if isinstance(content, str) else content)
    r = invoke(["--config", str(cfg), "simulate", "--trace", str(trace), *args], expect=2)
    assert message in r.stderr and "Traceback" not in r.stderr


def test_what_is_no_file_is_refused(cfg: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, message in ((fifo, "not a regular file"), (tmp_path / "none", "No such file")):
        r = invoke(["--config", str(cfg), "simulate", "--trace", str(path)], expect=2)
        assert message in r.stderr


def test_plots(cfg: Path, tmp_path: Path) -> None:
    trace = tmp_path / "t.swf"
    trace.write_text(SWF)
    out = tmp_path / "plots"
    r = invoke(["--config", str(cfg), "simulate", "--trace", str(trace), "--plot", str(out),
                "--json"])  # fmt: skip
    plots = json.loads(r.stdout)["plots"]
    assert sorted(Path(p).name for p in plots) == ["frontier.png", "wait-cdf.png"]
    assert all(Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = invoke(["--config", str(cfg), "simulate", "--trace", str(trace), "--plot",
                str(blocker / "x")], expect=2)  # fmt: skip
    assert "--plot" in r.stderr


def test_without_a_site_config_the_shipped_example_is_used(tmp_path: Path) -> None:
    trace = tmp_path / "t.swf"
    trace.write_text(SWF)
    missing = tmp_path / "none.toml"
    r = invoke(["--config", str(missing), "simulate", "--trace", str(trace), "--json"])
    assert "not found: using the example config" in r.stderr
    doc = json.loads(r.stdout)
    assert {g["name"] for g in doc["cloud"]} == {"cpu", "gpu"}
