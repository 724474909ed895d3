"""Trace parsing for the simulator: SWF, Alibaba's GPU CSV, sacct; bad input named."""

from __future__ import annotations

import pytest

from slurm_burst.core.workload import TraceError, parse_alibaba, parse_sacct, parse_swf

SWF = """\
; Version: 2.2
; UnixStartTime: 893466664
; MaxNodes: 128
; MaxProcs: 128
   11   566129      5  28826    1  27758    -1    1  28800    -1  5 153  75 18180  3 -1 -1 -1
   13   567314  15757   8071    8   7334    -1    8  64800    -1  1 150   6 13592  4 -1 -1 -1
   14   571164  21568     -1   -1     -1    -1   32  64800    -1  5   6   6 13602  3 -1 -1 -1
   16   561164     10    100   -1     -1    -1    4     -1    -1  1   6   6 13602  3 -1 -1 -1
   17       -1     -1     -1   -1     -1    -1   -1     -1    -1  1  36  -1  66 -1  2 -1 -1
"""


def test_swf() -> None:
    t = parse_swf(SWF.splitlines(), "x", limit_factor=3)
    assert (t.max_procs, t.max_nodes, t.start_epoch) == (128, 128, 893466664.0)
    assert [j.id for j in t.jobs] == ["16", "11", "13"]  # by submit time
    assert t.skipped == {"never ran": 1, "no submit time": 1}
    first, eleven, thirteen = t.jobs
    assert (first.cpus, first.limit) == (4, 300)  # no requested time: run x factor
    assert eleven.limit == 28826  # ran past its request: the run time is its limit
    assert (thirteen.cpus, thirteen.account, thirteen.user, thirteen.queue) == (8, "6", "150", "4")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1 2 3\n", "line 1: 3 fields"),
        (
            "; x\n 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 nan\n",
            "line 2: field 18 is not a number",
        ),
        (" 1 -5 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18\n", "submit time -5 s is not within"),
        (" 1 x 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18\n", "line 1: field 2 is not a number"),
        ("9" * 5000, "not a trace line"),
        (" 1 ² 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18\n", "line 1: field 2 is not a number"),
        (" 1 ٣ 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18\n", "line 1: field 2 is not a number"),
        (" 1 1_0 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18\n", "line 1: field 2 is not a number"),
        (" 1 1e300 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18\n", "field 2 '1e300' is out of bounds"),
        (
            " 1 0 3 2000000000 5 6 7 8 9 10 11 12 13 14 15 16 17 18\n",
            "run time 2e\\+09 s is over 40 years",
        ),
        ("; MaxProcs: " + "9" * 400 + "\n", "line 1: MaxProcs .* is not a whole number"),
        ("; MaxProcs: 99999999999\n", "line 1: MaxProcs 99,999,999,999 is not between"),
        (" 1 0 3 4 5 6 7 99999999999 9 10 11 12 13 14 15 16 17 18\n", "processors is over"),
    ],
    ids=[
        "fields",
        "nan",
        "negative",
        "garbage",
        "huge",
        "superscript",
        "arabic-indic",
        "underscore",
        "magnitude",
        "run-2e9-s",
        "header-400-digits",
        "header-too-big",
        "procs",
    ],
)
def test_bad_swf_is_named(text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        parse_swf(text.splitlines())


def test_a_superscript_in_a_header_is_text_not_a_crash() -> None:
    """Words (and digits of other scripts) in an SWF header are left out, as before."""
    t = parse_swf(
        ["; MaxProcs: ²⁵⁶", "; TimeZone: 三", " 1 0 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18"]
    )
    assert t.max_procs is None and t.utc_offset is None and len(t.jobs) == 1


def test_an_over_long_quoted_csv_field_is_named() -> None:
    head = ALIBABA.splitlines()[0]
    with pytest.raises(TraceError, match="line 34: not CSV: field larger than field limit"):
        parse_alibaba([head, 'p0,"' + "x" * 4000] + ["y" * 4000] * 40)


@pytest.mark.parametrize(
    ("tres", "message"),
    [
        ("gres/gpu=-2", "not a whole number"),
        ("gres/gpu=9999", "not between 0 and 4,096"),
        ("gres/gpu=²", "not a whole number"),
    ],
    ids=["negative", "huge", "superscript"],
)
def test_sacct_gpu_counts_are_whole_and_bounded(tres: str, message: str) -> None:
    line = (
        f"7|physics|alice|2026-01-01T00:00:00|2026-01-01T00:01:00|2026-01-01T01:00:00|60|4|{tres}"
    )
    with pytest.raises(TraceError, match=f"line 1: gres/gpu .*{message}"):
        parse_sacct([line])


ALIBABA = """\
name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,12000,16384,1,1000,,LS,Running,0,1000,10
p1,6500,12288,8,1000,,BE,Running,5,905,5
p2,6000,12288,1,460,,LS,Pending,7,900,
"""


def test_alibaba() -> None:
    t = parse_alibaba(ALIBABA.splitlines(), limit_factor=1.5)
    assert [(j.id, j.submit, j.run, j.limit, j.cpus, j.gpus, j.account) for j in t.jobs] == [
        ("p0", 0, 990, 1485, 12, 1, "LS"),
        ("p1", 5, 900, 1350, 7, 8, "BE"),
    ]
    assert t.skipped == {"never scheduled": 1} and t.gpus


def test_bad_alibaba_is_named() -> None:
    with pytest.raises(TraceError, match="header lacks"):
        parse_alibaba(["a,b\n"])
    with pytest.raises(TraceError, match="line 2: scheduled_time before"):
        parse_alibaba([ALIBABA.splitlines()[0], "p,1000,1,1,1,,LS,Running,50,90,10"])


def test_sacct() -> None:
    lines = [
        "101|physics|alice|2026-10-01T10:00:00|2026-10-01T10:05:00|2026-10-01T11:05:00|120|8|"
        "cpu=8,gres/gpu=2,mem=8G,node=1",
        "102|chem|bob|2026-10-01T09:00:00|Unknown|Unknown|60|1|cpu=1",
        "103|chem|bob|2026-10-01T10:30:00|2026-10-01T10:30:00|2026-10-01T10:40:00||2|cpu=2",
    ]
    t = parse_sacct(lines, limit_factor=2)
    assert [(j.id, j.submit, j.run, j.limit, j.cpus, j.gpus, j.account) for j in t.jobs] == [
        ("101", 0, 3600, 7200, 8, 2, "physics"),
        ("103", 1800, 600, 1200, 2, 0, "chem"),
    ]
    assert t.skipped == {"never ran": 1}
    with pytest.raises(TraceError, match="line 1: 2 fields"):
        parse_sacct(["a|b"])
