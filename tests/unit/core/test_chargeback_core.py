"""Pure chargeback core: money, rates, the allocation's exactness, sacct and assoc parsing."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from fractions import Fraction
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_burst.adapters.slurm.accounting import parse_assoc_usage, parse_job
from slurm_burst.core.allocation import (
    DAY_MS,
    OVERHEAD,
    RATE_ADJUSTMENT,
    USAGE,
    InstanceSpan,
    JobSpan,
    allocate,
    split,
)
from slurm_burst.core.pricing import (
    PricingError,
    Rate,
    RateTable,
    ambiguous,
    billing_weight,
    cost_micros,
    parse_instant,
    to_micros,
)
from tests.conftest import examples

H = 3_600_000


@pytest.mark.parametrize(
    ("text", "micros"),
    [("0.085", 85_000), ("2.5", 2_500_000), ("0", 0), ("0.0000005", 0), ("0.0000015", 2)],
    ids=["cents", "dollars", "zero", "half-even-down", "half-even-up"],
)
def test_to_micros(text: str, micros: int) -> None:
    assert to_micros(text) == micros


@pytest.mark.parametrize(
    "bad",
    ["abc", "nan", "inf", "", "1e308", "-1e12", "9" * 5000],
    ids=["word", "nan", "inf", "empty", "1e308", "minus-a-trillion", "5000-digits"],
)
def test_to_micros_rejects(bad: str) -> None:
    with pytest.raises(PricingError):
        to_micros(bad)


def test_cost_is_additive_over_cuts() -> None:
    price = 2_800_000
    cuts = [0, 1, 999, 61_234, 3_599_999, H, 5 * H + 17]
    pieces = [cost_micros(price, b) - cost_micros(price, a) for a, b in pairwise(cuts)]
    assert sum(pieces) == cost_micros(price, cuts[-1])
    assert cost_micros(price, H) == price


def test_rates_latest_start_wins_and_accounts_override() -> None:
    jan = datetime(2026, 1, 1, tzinfo=UTC)
    table = RateTable(
        [
            Rate("base", "g1", 2_500_000),
            Rate("2026", "g1", 1_400_000, per="gpu", valid_from=jan),
            Rate("grant", "g1", 1_000_000, valid_from=jan, account="chem"),
        ]
    )
    before = datetime(2025, 6, 1, tzinfo=UTC)
    after = datetime(2026, 6, 1, tzinfo=UTC)
    assert table.price("g1", 2, before).micros_per_hour == 2_500_000  # type: ignore[union-attr]
    p = table.price("g1", 2, after)
    assert p is not None and (p.micros_per_hour, p.source) == (2_800_000, "2026")
    assert p.version == "2026-01-01T00:00:00Z"
    assert table.price("g1", 2, after, "chem").micros_per_hour == 1_000_000  # type: ignore[union-attr]
    assert table.price("g1", 2, before, "chem").micros_per_hour == 2_500_000  # type: ignore[union-attr]
    assert table.account_overrides("g1", 2, after) == {"chem": 1_000_000}
    assert table.price("nosuch", 0, after) is None


def test_ambiguous_rates() -> None:
    a, b = Rate("a", "s", 1), Rate("b", "s", 2)
    assert ambiguous([a, b, Rate("c", "s", 3, account="x")]) == [(a, b)]


def test_parse_instant() -> None:
    assert parse_instant("2026-03-01", "x") == datetime(2026, 3, 1, tzinfo=UTC)
    assert parse_instant("2026-03-01T12:00:00+02:00", "x").hour == 10
    with pytest.raises(PricingError, match="valid_from"):
        parse_instant("March", "valid_from")


def test_billing_weight_is_micro_dollars_per_minute_per_unit() -> None:
    assert billing_weight(85_000, 2) == 708  # $0.085/h over 2 CPUs
    assert billing_weight(2_800_000, 2) == 23_333  # $2.80/h over 2 GPUs


@pytest.mark.parametrize(
    ("total", "weights", "want"),
    [
        (10, [1, 1, 1], [4, 3, 3]),
        (-10, [1, 1, 1], [-4, -3, -3]),
        (7, [0, 0], [7, 0]),
        (5, [Fraction(1, 2), Fraction(1, 2)], [3, 2]),
    ],
    ids=["thirds", "negative", "zero-weights", "halves"],
)
def test_split(total: int, weights: list[Fraction], want: list[int]) -> None:
    assert split(total, [Fraction(w) for w in weights]) == want


def test_allocation_of_one_job_and_idle() -> None:
    inst = InstanceSpan("i-1", "n1", "burst-cpu", 0, H, 85_000, cpus=2)
    job = JobSpan("c:1:0", "physics", "alice", H // 4, 3 * H // 4, cpus=2)
    lines = allocate(inst, [job])
    usage = [c for c in lines if c.kind == USAGE]
    over = [c for c in lines if c.kind == OVERHEAD]
    assert [c.amount_micros for c in usage] == [42_500]
    assert [(c.account, c.job_key, c.amount_micros) for c in over] == [
        ("physics", "c:1:0", 42_500)
    ]  # idle half spread to the only user
    assert sum(c.amount_micros for c in lines) == inst.cost == 85_000
    assert sum(c.node_ms for c in lines) == H


def test_unused_instance_goes_to_the_site_account() -> None:
    inst = InstanceSpan("i-2", "n1", "burst-gpu", 0, H // 2, 2_800_000, cpus=2, gpus=2)
    lines = allocate(inst, [], site_account="site")
    assert [(c.kind, c.account, c.amount_micros) for c in lines] == [(OVERHEAD, "site", 1_400_000)]
    assert lines[0].gpu_ms == H  # 2 GPUs x half an hour, all idle


def test_gpu_size_shares_by_gpus_and_rule_site() -> None:
    inst = InstanceSpan("i-3", "n1", "burst-gpu", 0, H, 2_000_000, cpus=8, gpus=2)
    jobs = [JobSpan("a", "physics", "u", 0, H, cpus=8, gpus=1)]
    lines = allocate(inst, jobs, rule="site", site_account="site")
    assert {(c.kind, c.account): c.amount_micros for c in lines} == {
        (USAGE, "physics"): 1_000_000,
        (OVERHEAD, "site"): 1_000_000,
    }


def test_account_override_books_the_difference_to_the_site() -> None:
    inst = InstanceSpan("i-4", "n1", "burst-cpu", 0, H, 100_000, cpus=1)
    jobs = [JobSpan("a", "chem", "u", 0, H, cpus=1)]
    lines = allocate(inst, jobs, overrides={"chem": 60_000}, site_account="site")
    got = {(c.kind, c.account): c.amount_micros for c in lines}
    assert got == {(USAGE, "chem"): 60_000, (RATE_ADJUSTMENT, "site"): 40_000}


def test_lines_are_cut_at_midnight() -> None:
    start = 20 * DAY_MS - H
    inst = InstanceSpan("i-5", "n1", "p", start, start + 2 * H, 3_600_000, cpus=1)
    lines = allocate(inst, [JobSpan("a", "x", "u", start, start + 2 * H, cpus=1)])
    days = sorted({c.day for c in lines})
    assert len(days) == 2
    assert [c.amount_micros for c in lines] == [3_600_000, 3_600_000]


jobs_st = st.lists(
    st.tuples(
        st.integers(0, 3 * DAY_MS),
        st.integers(1, 2 * DAY_MS),
        st.integers(0, 16),
        st.integers(0, 4),
        st.sampled_from(["physics", "chem", "bio"]),
    ),
    max_size=12,
)


@settings(max_examples=examples(300), deadline=None)
@given(
    start=st.integers(0, 2 * DAY_MS),
    length=st.integers(0, 3 * DAY_MS),
    price=st.integers(0, 50_000_000),
    cpus=st.integers(1, 16),
    gpus=st.integers(0, 4),
    jobs=jobs_st,
    rule=st.sampled_from(["usage", "site"]),
    override=st.integers(0, 10_000_000),
)
def test_every_micro_dollar_appears_exactly_once(
    start: int,
    length: int,
    price: int,
    cpus: int,
    gpus: int,
    jobs: list[tuple[int, int, int, int, str]],
    rule: str,
    override: int,
) -> None:
    inst = InstanceSpan("i", "n", "p", start, start + length, price, cpus=cpus, gpus=gpus)
    spans = [
        JobSpan(f"j{i}", acct, "u", s, s + d, cpus=c, gpus=g)
        for i, (s, d, c, g, acct) in enumerate(jobs)
    ]
    lines = allocate(inst, spans, rule=rule, site_account="site", overrides={"bio": override})
    assert sum(c.amount_micros for c in lines) == inst.cost
    assert sum(c.node_ms for c in lines) == length
    assert sum(c.gpu_ms for c in lines) == length * gpus
    assert all(c.node_ms >= 0 and c.gpu_ms >= 0 for c in lines)
    keys = [(c.instance_id, c.day, c.kind, c.job_key, c.account) for c in lines]
    assert len(keys) == len(set(keys)), "the ledger's unique key holds"


SACCT_JOB = {
    "job_id": 42,
    "account": "physics",
    "user": "alice",
    "partition": "burst-gpu",
    "nodes": "burst-gpu-[1-2]",
    "allocation_nodes": 2,
    "cluster": "burstlab",
    "state": {"current": "COMPLETED", "reason": "None"},
    "time": {"submission": 1795285100, "start": 1795285167, "end": 1795285268},
    "tres": {
        "allocated": [
            {"type": "cpu", "name": None, "count": 4},
            {"type": "mem", "name": None, "count": 2000},
            {"type": "gres", "name": "gpu", "count": 2},
            {"type": "billing", "name": None, "count": 46666},
        ]
    },
}


def test_parse_sacct_job() -> None:
    job = parse_job(json.loads(json.dumps(SACCT_JOB)), "burstlab")
    assert job is not None
    assert (job.job_id, job.account, job.user, job.cpus, job.gpus, job.mem_mb) == (
        42,
        "physics",
        "alice",
        4,
        2,
        2000,
    )
    assert job.node_count == 2 and job.nodes == "burst-gpu-[1-2]"
    assert job.key == "burstlab:42:1795285167"
    assert (job.end - job.start).total_seconds() == 101


@pytest.mark.parametrize(
    "change",
    [{"state": {"current": "RUNNING"}}, {"time": {"start": 1795285167, "end": 0}}],
    ids=["running", "no-end"],
)
def test_parse_sacct_skips_unfinished(change: dict[str, object]) -> None:
    assert parse_job({**SACCT_JOB, **change}, "burstlab") is None


ASSOC = """Current Association Manager state

Association Records

ClusterName=burstlab Account=chemistry UserName= Partition= Priority=0 ID=4
    UsageRaw/Norm/Efctv=2124.00/0.00/0.00
    GrpTRESMins=cpu=N(0),mem=N(0),billing=998746(35),gres/gpu=N(0)
    GrpTRESRunMins=cpu=N(0),billing=N(42480)
ClusterName=burstlab Account=chemistry UserName=root(0) Partition= Priority=0 ID=7
    GrpTRESMins=cpu=N(0),billing=N(35)
"""


def test_parse_assoc_usage() -> None:
    u = parse_assoc_usage(ASSOC, "chemistry")
    assert (u.used, u.running, u.limit) == (35, 42480, 998746)
    nolimit = parse_assoc_usage(ASSOC.replace("998746(35)", "N(35)"), "chemistry")
    assert nolimit.limit is None
