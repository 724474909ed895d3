"""Every parser of outside input, fed what breaks parsers: no exception but its own error.

Generated per class of the second hardening round: configs nested thousands of levels
deep, holding control characters in any key or string, numbers past any bound, other
scripts' digits in times; traces with such numbers, over-long CSV fields, negative GPU
counts. A config either loads or lists its problems, each rendered on one line; a trace
either parses into bounded jobs or raises TraceError naming a line.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_burst.config.load import parse_config
from slurm_burst.core.workload import (
    MAX_GPUS,
    MAX_PROCS,
    MAX_RUN,
    TraceError,
    parse_alibaba,
    parse_sacct,
    parse_swf,
)
from tests.conftest import examples
from tests.unit.test_config import GOOD

pytestmark = pytest.mark.unit

NASTY = st.sampled_from(
    ["\n", "\x00", "\x1b", "\u2028", "\u202e", "\x85", "¹", "٣", "²m", "1_0", "nan", "inf",
     "-1", "9" * 400, "1e999", "", " ", "#", '"', "\\", "=", ",", "[", "]"]
)  # fmt: skip
TEXT = st.lists(st.one_of(NASTY, st.text(max_size=4)), max_size=4).map("".join)
NUMBER = st.one_of(
    st.integers(-(2**70), 2**70).map(str), st.floats().map(str), NASTY, st.text(max_size=6)
)


@st.composite
def hostile_configs(draw: st.DrawFn) -> str:
    """The good config with one hostile edit: a value, a key, a nesting, a count."""
    edit = draw(st.sampled_from(["value", "key", "nest", "count", "warm", "groups"]))
    if edit == "value":
        key = draw(st.sampled_from(["image", "partition", "gpu_type", "pattern"]))
        return GOOD.replace(f"\n{key} = ", f"\n{key} = {json.dumps(draw(TEXT))}\n#", 1)
    if edit == "key":
        return GOOD + f"\n[node_groups.{json.dumps(draw(TEXT))}]\ncount = 1\n"
    if edit == "nest":
        depth = draw(st.sampled_from([11, 100, 999, 1001, 5000]))
        inner = draw(
            st.sampled_from(["[" * depth + "]" * depth, "{a = " * depth + "1" + "}" * depth])
        )
        return GOOD + f"\n[providers.aws.options]\nx = {inner}\n"
    if edit == "count":
        return GOOD.replace("count = 3", f"count = {draw(NUMBER)}")
    if edit == "warm":
        start = draw(st.one_of(st.sampled_from(["0²:00", "٠٣:00", "24:00", "3:0"]), TEXT))
        return (
            GOOD
            + f'\n[node_groups.gpu.warm.w]\nnodes = 1\nstart = {json.dumps(start)}\nend = "04:00"\n'
        )
    extra = draw(st.integers(1, 40))
    return GOOD + "".join(
        f'\n[node_groups.g{i}]\npattern = "g{i}-{{n}}"\ncount = 65536\npartition = "p"\n'
        f'providers = ["aws"]\nsizes = ["x"]\nimage = "i"\ncpus = 1\nmemory_mb = 1\n'
        for i in range(extra)
    )


@settings(max_examples=examples(1500), deadline=None)
@given(text=hostile_configs())
def test_a_hostile_config_loads_or_says_why_on_one_line(text: str) -> None:
    cfg, problems = parse_config(text, "site.toml")
    for p in problems:
        line = p.render("site.toml")
        assert "\n" not in line and "\u2028" not in line and "\x00" not in line, line
    if cfg is not None and not [p for p in problems if p.severity == "error"]:
        assert sum(g.count for g in cfg.node_groups.values()) <= 65_536


SWF_JOB = [NUMBER] * 18


@st.composite
def swf_lines(draw: st.DrawFn) -> list[str]:
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            key = draw(st.sampled_from(["MaxProcs", "MaxNodes", "UnixStartTime", "TimeZone"]))
            lines.append(f"; {key}: {draw(NUMBER)}")
        else:
            good = ["1", "0", "3", "60", "4", "-1", "-1", "4", "120", "-1", "1", "7", "3",
                    "-1", "1", "-1", "-1", "-1"]  # fmt: skip
            i = draw(st.integers(0, 17))
            good[i] = draw(NUMBER).replace(" ", "").replace("\n", "") or "x"
            lines.append(" ".join(good))
    return lines


def _bounded(trace: object) -> None:
    for j in trace.jobs:  # type: ignore[attr-defined]
        assert math.isfinite(j.submit) and j.submit >= 0
        assert 0 < j.run <= MAX_RUN and j.run <= j.limit <= MAX_RUN
        assert 1 <= j.cpus <= MAX_PROCS and 0 <= j.gpus <= MAX_GPUS


@settings(max_examples=examples(1500), deadline=None)
@given(lines=swf_lines())
def test_a_hostile_swf_trace_parses_bounded_or_names_its_line(lines: list[str]) -> None:
    try:
        trace = parse_swf(lines)
    except TraceError as exc:
        assert str(exc).startswith("line "), exc
        return
    _bounded(trace)
    assert trace.max_procs is None or 1 <= trace.max_procs <= MAX_PROCS


@settings(max_examples=examples(1000), deadline=None)
@given(field=st.sampled_from(["NCPUS", "TimelimitRaw", "gres"]), value=NUMBER)
def test_a_hostile_sacct_line_parses_bounded_or_names_its_line(field: str, value: str) -> None:
    parts = {"NCPUS": "4", "TimelimitRaw": "60", "gres": "gres/gpu=1"}
    parts[field] = f"gres/gpu={value}" if field == "gres" else value
    line = (
        f"7|physics|alice|2026-01-01T00:00:00|2026-01-01T00:01:00|2026-01-01T01:00:00|"
        f"{parts['TimelimitRaw']}|{parts['NCPUS']}|{parts['gres']}"
    )
    try:
        trace = parse_sacct([line.replace("\n", " ")])
    except TraceError as exc:
        assert str(exc).startswith("line 1:"), exc
        return
    _bounded(trace)


@settings(max_examples=examples(500), deadline=None)
@given(field=st.text(max_size=20), length=st.integers(0, 300_000))
def test_a_hostile_alibaba_csv_parses_or_names_its_line(field: str, length: int) -> None:
    head = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
            "creation_time,deletion_time,scheduled_time")  # fmt: skip
    body = f'p0,"{field}{"x" * length}",1,1,1,,LS,Running,0,1000,10'
    try:
        trace = parse_alibaba([head] + [body[i : i + 4000] for i in range(0, len(body), 4000)])
    except TraceError as exc:
        assert str(exc).startswith("line "), exc
        return
    _bounded(trace)


@pytest.mark.parametrize("count", [-2, 2**41, "4", 1.5, True], ids=str)
def test_a_sacct_job_with_a_count_that_is_none_is_refused_not_charged(count: object) -> None:
    """A negative GPU count was charged and reported as negative utilization."""
    from slurm_burst.adapters.slurm.accounting import parse_job

    raw = {
        "job_id": 7, "account": "physics", "state": {"current": "COMPLETED"},
        "time": {"start": 1_700_000_000, "end": 1_700_000_600, "submission": 1_700_000_000},
        "tres": {"allocated": [{"type": "cpu", "count": 4},
                               {"type": "gres", "name": "gpu", "count": count}]},
    }  # fmt: skip
    assert parse_job(raw, "c1") is None
    raw["tres"]["allocated"][1]["count"] = 2  # type: ignore[index]
    job = parse_job(raw, "c1")
    assert job is not None and (job.cpus, job.gpus) == (4, 2)
