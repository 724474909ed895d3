"""squeue's pending queue as the burst policy reads it: the fields of each release's
``--Format`` line, time limits, GPU requests, and lines it must refuse (with the line's
number) rather than guess."""

from __future__ import annotations

import math

import pytest

from slurm_burst.core.slurm import QUEUE_FIELDS, QueuedJob, gpus_of, parse_queue, parse_time_limit

LINE = (
    "41|batch,debug|physics|normal|8|2|N/A|gres:gpu:a100:2|1-02:03:04|1790000000|4242|"
    "1790007200|Resources|"
)


def test_a_line_becomes_a_job() -> None:
    (j,) = parse_queue(LINE + "\n")
    assert j.id == "41" and j.partitions == ("batch", "debug")
    assert (j.account, j.qos, j.cpus, j.nodes, j.gpus) == ("physics", "normal", 8, 2, 4)
    assert j.limit == ((24 + 2) * 60 + 3) * 60 + 4 and j.submit == 1_790_000_000
    assert (j.priority, j.expected_start, j.reason) == (4242, 1_790_007_200, "Resources")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5:00", 300), ("1:00:00", 3600), ("2-00:00:00", 172_800), ("0:07", 7),
     ("UNLIMITED", None), ("NOT_SET", None)],
)  # fmt: skip
def test_time_limits(text: str, seconds: float | None) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "1:2:3:4", "x:00", "-1:00", "1-x:00:00",
                                  "nan", "1e9:00", "9999999999:00"])  # fmt: skip
def test_time_limits_not_understood(text: str) -> None:
    with pytest.raises(ValueError, match="time limit"):
        parse_time_limit(text)


@pytest.mark.parametrize(
    ("tres", "gpus"),
    [("N/A", 0), ("gres:gpu:2", 2), ("gres/gpu:a100:1", 1), ("gres:gpu", 1),
     ("gres/gpu:2,gres/gpu:t4:1", 3), ("gres:mps:100", 0), ("gres/gpumem:40G", 0)],
)  # fmt: skip
def test_gpus_of(tres: str, gpus: int) -> None:
    assert gpus_of(tres) == gpus


def test_an_unlimited_job_and_no_estimate() -> None:
    (j,) = parse_queue(LINE.replace("1-02:03:04", "UNLIMITED").replace("|1790007200|", "|N/A|"))
    assert j.limit == math.inf and j.expected_start is None


@pytest.mark.parametrize(
    "line",
    [LINE[:-1],  # no closing "|"
     LINE + "extra|",  # a field too many
     LINE.replace("|8|", "|eight|"),
     LINE.replace("|1790000000|", "|nan|"),
     LINE.replace("|1790000000|", "|1e9|"),
     LINE.replace("|4242|", "|" + "9" * 5000 + "|"),
     LINE.replace("1-02:03:04", "soon")],
)  # fmt: skip
def test_lines_it_refuses_say_where(line: str) -> None:
    with pytest.raises(ValueError, match="squeue line 2"):
        parse_queue(LINE + "\n" + line + "\n")


def test_a_line_seen_before_is_not_parsed_again() -> None:
    known: dict[str, QueuedJob] = {}
    first = parse_queue(LINE + "\n", known)
    again = parse_queue(LINE + "\n", known)
    assert again[0] is first[0] and list(known) == [LINE]
    parse_queue("", known)
    assert known == {}


def test_the_fields_are_those_every_release_has() -> None:
    assert len(QUEUE_FIELDS) == LINE.count("|")
