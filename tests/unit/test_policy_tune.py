"""``slurm-burst policy tune`` and ``simulate --tune`` end to end on a small busy trace:
the search, the held-out report, the [policy] block and its drop-in, money respected,
and what it refuses (exit 1 and 2)."""

from __future__ import annotations

import json
import random
import tomllib
from pathlib import Path
from typing import Any

import pytest

from slurm_burst.config import load_config
from slurm_burst.core.tuning import Knobs, Point, Space, bisect_wait_per_dollar, cheapest, frontier
from tests.conftest import invoke
from tests.unit.test_config import GOOD, write
from tests.unit.test_simulate_cli import CPU_GROUP


def busy_swf(n: int = 400, seed: int = 7) -> str:
    """16 CPUs, jobs of 1-16 CPUs and 10 min to 4 h arriving every ~15 min: a queue
    that builds by day and drains by night."""
    r = random.Random(seed)
    t, lines = 0, ["; MaxProcs: 16\n"]
    for i in range(1, n + 1):
        t += int(r.expovariate(1 / 900))
        run = r.choice([600, 1800, 3600, 14_400])
        cpus = r.choice([1, 2, 4, 8, 16])
        lines.append(f"{i} {t} 0 {run} {cpus} -1 -1 {cpus} {run * 2} -1 1 1 1 1 1 -1 -1 -1\n")
    return "".join(lines)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    trace = tmp_path / "busy.swf"
    trace.write_text(busy_swf())
    return write(tmp_path, GOOD + CPU_GROUP), trace


def tune(cfg: Path, trace: Path, *args: str, code: int = 0) -> dict[str, Any]:
    r = invoke(["--config", str(cfg), "policy", "tune", "--trace", str(trace), "--workers",
                "1", "--json", *args], expect=code)  # fmt: skip
    return json.loads(r.stdout) if code in (0, 1) and r.stdout else {}


def test_tuned_on_the_first_half_reported_on_the_rest(setup: tuple[Path, Path]) -> None:
    cfg, trace = setup
    doc = tune(cfg, trace)
    assert doc["split"] == {"tuning_jobs": 200, "held_out_jobs": 200}
    assert set(doc["held_out"]) == {"never", "always", "policy", "tuned"}
    never, always = doc["held_out"]["never"], doc["held_out"]["always"]
    assert never["wait_cut"] == 0 and always["wait_cut"] == 1 and always["cost_share"] == 1
    for f in doc["held_out"].values():
        assert {"dollars_per_month", "p95_wait", "mean_wait"} <= set(f)
    # each combination's best, checked on the tuning part's latest third: the cheapest
    # there that reaches the target wins
    assert len(doc["checked"]) == 9  # 3 min_wait x 2 wait_factor, 3 min_wait x burst_share
    good = [p for p in doc["checked"] if p["wait_cut"] >= 0.9]
    assert doc["reached"] and good
    won = min(good, key=lambda p: p["cloud_cost"])
    assert {k: won[k] for k in doc["tuned"]} == doc["tuned"]
    block = tomllib.loads(doc["policy_block"])
    assert block["policy"]["wait_per_dollar"] == doc["tuned"]["wait_per_dollar"]
    assert doc["policy_block"].startswith("# Tuned by `slurm-burst policy tune`")


def test_simulate_tune_reports_the_four_policies_on_the_second_half(
    setup: tuple[Path, Path],
) -> None:
    cfg, trace = setup
    r = invoke(["--config", str(cfg), "simulate", "--trace", str(trace), "--tune", "--json"])
    doc = json.loads(r.stdout)
    assert set(doc["policies"]) == {"never", "always", "policy", "tuned"}
    held = tune(cfg, trace)["held_out"]
    for name, p in doc["policies"].items():
        assert p["wait_cut"] == held[name]["wait_cut"]
        assert p["cost_share"] == held[name]["cost_share"]
    assert doc["split"]["held_out_jobs"] == 200 and doc["tuned"]["wait_per_dollar"] > 0
    table = invoke(["--config", str(cfg), "simulate", "--trace", str(trace), "--tune"]).stdout
    assert "tuned" in table and "[policy]" in table


def test_apply_writes_a_drop_in_and_leaves_the_config_alone(setup: tuple[Path, Path]) -> None:
    cfg, trace = setup
    before = cfg.read_bytes()
    doc = tune(cfg, trace, "--apply")
    dropin = cfg.parent / "slurm-burst.d" / "50-policy-tune.toml"
    assert doc["applied"] == str(dropin) and cfg.read_bytes() == before
    assert oct(dropin.stat().st_mode & 0o777) == "0o644"
    assert load_config(cfg).policy.wait_per_dollar == doc["tuned"]["wait_per_dollar"]


def test_apply_follows_no_link(setup: tuple[Path, Path], tmp_path: Path) -> None:
    cfg, trace = setup
    (cfg.parent / "slurm-burst.d").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("# keep\n")
    (cfg.parent / "slurm-burst.d" / "50-policy-tune.toml").symlink_to(victim)
    r = invoke(["--config", str(cfg), "policy", "tune", "--trace", str(trace), "--workers",
                "1", "--apply"], expect=2)  # fmt: skip
    assert "not a regular file" in r.stderr and victim.read_text() == "# keep\n"


def test_money_binds_every_setting_tried(setup: tuple[Path, Path]) -> None:
    """A spend cap of $0 a month: no setting can burst, the target is not reached, and
    --apply writes nothing (exit 1)."""
    cfg, trace = setup
    doc = tune(cfg, trace, "--spend-cap", "0")
    assert not doc["reached"] and doc["money"]["spend_cap"] == 0
    assert doc["held_out"]["tuned"]["cloud_cost"] == 0 == doc["held_out"]["policy"]["cloud_cost"]
    assert doc["held_out"]["always"]["cloud_cost"] > 0  # the baseline has no cap
    tune(cfg, trace, "--spend-cap", "0", "--apply", code=1)
    assert not (cfg.parent / "slurm-burst.d" / "50-policy-tune.toml").exists()


def test_a_held_out_part_with_seconds_of_wait_has_nothing_to_cut(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    """The busy trace's first half, then a quiet one (a 1-CPU job an hour): burst-always
    cuts nothing worth a share there, and the command says so rather than scoring it."""
    busy = busy_swf(200).splitlines(keepends=True)
    last = int(busy[-1].split()[1])
    quiet = [f"{200 + i} {last + 3600 * i} 0 600 1 -1 -1 1 1200 -1 1 1 1 1 1 -1 -1 -1\n"
             for i in range(1, 201)]  # fmt: skip
    trace = tmp_path / "quiet.swf"
    trace.write_text("".join(busy + quiet))
    cfg, busy_trace = setup
    doc = tune(cfg, trace)
    goal = doc["goal"]
    assert goal["held_out_cut_seconds"] < goal["min_cut_seconds"] == 60
    assert goal["met"] is None and goal["verdict"] == "nothing to cut"
    text = invoke(["--config", str(cfg), "policy", "tune", "--trace", str(trace), "--workers",
                   "1"]).stdout  # fmt: skip
    assert "nothing worth bursting for there" in text
    # the busy trace's held-out half has a cut worth sharing: met or missed, said
    busy_doc = tune(cfg, busy_trace)
    assert busy_doc["goal"]["held_out_cut_seconds"] >= 60
    assert busy_doc["goal"]["verdict"] == ("met" if busy_doc["goal"]["met"] else "missed")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--budget", "chem"], "ACCOUNT=DOLLARS"),
        (["--budget", "chem=nan"], "a number from 0 to 1e12"),
        (["--budget", "a b=5"], "ACCOUNT=DOLLARS"),
        (["--target", "nan"], "--target"),
        (["--split", "0.99"], "--split"),
    ],
)
def test_bad_input_exits_2(setup: tuple[Path, Path], args: list[str], said: str) -> None:
    cfg, trace = setup
    r = invoke(["--config", str(cfg), "policy", "tune", "--trace", str(trace), *args], expect=2)
    assert said in r.stderr


def test_apply_needs_a_site_config(tmp_path: Path, setup: tuple[Path, Path]) -> None:
    _, trace = setup
    r = invoke(["--config", str(tmp_path / "none.toml"), "policy", "tune", "--trace",
                str(trace), "--apply"], expect=2)  # fmt: skip
    assert "no config at" in r.stderr


def test_the_bisection_finds_the_largest_setting_that_reaches_the_target() -> None:
    """A made-up policy whose wait cut falls with wait_per_dollar: 1 - log10(w) / 8."""
    import math

    def measure(k: Knobs) -> Point:
        cut = 1 - math.log10(k.wait_per_dollar) / 8
        return Point(k, cut, cut, cut * 100, 0.0, 0.0)

    points = bisect_wait_per_dollar(measure, 0.75, 0.0, 0.0, 1.0, Space(steps=12))
    best = cheapest(points, 0.75)
    assert best is not None and best.knobs.wait_per_dollar == pytest.approx(100, rel=0.01)
    edge = frontier(points)
    assert [p.cost for p in edge] == sorted(p.cost for p in edge)
    assert len(points) == 14  # the top, the bottom, 12 halvings


def test_the_frontier_plot(setup: tuple[Path, Path], tmp_path: Path) -> None:
    cfg, trace = setup
    doc = tune(cfg, trace, "--plot", str(tmp_path / "plots"))
    assert [Path(p).name for p in doc["plots"]] == ["tuning-frontier.png"]
    assert Path(doc["plots"][0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = invoke(["--config", str(cfg), "policy", "tune", "--trace", str(trace),
                    "--workers", "1"]).stdout  # fmt: skip
    assert "held out: 200 jobs" in table and "[policy]" in table and "burst_share" in table
