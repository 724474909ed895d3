"""``slurm-burst simulate``: what bursting would have done on a job trace."""

from __future__ import annotations

import gzip
import io
import itertools
import os
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import click

from slurm_burst.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_PRECONDITION,
    FiniteRange,
    Progress,
    Whole,
    app,
    emit,
    fail,
    json_option,
)
from slurm_burst.config import Config, ConfigError, load_config
from slurm_burst.core.workload import Trace

COLUMNS = ["POLICY", "MEAN WAIT", "MEDIAN", "P95", "BSLD", "BURST JOBS", "CLOUD $", "NODE-H",
           "GPU-H", "UTIL", "GPU UTIL", "WAIT CUT", "COST"]  # fmt: skip
TRACE_MAX = 1 << 30  # bytes, uncompressed: the Parallel Workloads Archive's largest is 200 MB
TRACE_LINES = 20_000_000  # lines, blank ones too: a year of a busy cluster is ~2 million jobs


def _read(path: str) -> Iterator[str]:
    """The trace's lines (gzip or plain text), streamed: a regular file only, each line
    at most MAX_LINE characters of UTF-8, at most TRACE_LINES lines and TRACE_MAX bytes
    once uncompressed. What breaks a bound raises TraceError naming the line, so a
    small archive that expands to gigabytes of blank lines costs no memory."""
    from slurm_burst.core.workload import MAX_LINE

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        fail(f"--trace {path}: {exc.strerror}", EXIT_BAD_INPUT)
    except ValueError:  # a NUL byte: no file has such a name
        fail(f"--trace {path!r}: a path cannot hold a NUL byte", EXIT_BAD_INPUT)
    raw = io.BufferedReader(io.FileIO(fd, "rb"))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raw.close()
        fail(f"--trace {path}: not a regular file", EXIT_BAD_INPUT)
    return _lines(raw, MAX_LINE)


def _lines(raw: io.BufferedReader[io.FileIO], max_line: int) -> Iterator[str]:
    from slurm_burst.core.workload import TraceError

    with raw:
        gz = raw.peek(2)[:2] == b"\x1f\x8b"
        fh: IO[bytes] = gzip.GzipFile(fileobj=raw) if gz else raw  # type: ignore[assignment]
        total = 0
        number = 0
        try:
            while True:
                line = fh.readline(4 * max_line + 2)  # 4 bytes a character at most
                if not line:
                    return
                number += 1
                total += len(line)
                if number > TRACE_LINES or total > TRACE_MAX:
                    raise TraceError(
                        f"line {number:,}: over {TRACE_LINES:,} lines or "
                        f"{TRACE_MAX >> 20:,} MiB uncompressed: not a trace this can replay"
                    )
                if len(line) > 4 * max_line + 1:
                    raise TraceError(f"line {number:,}: over {max_line:,} characters")
                try:
                    yield line.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise TraceError(f"line {number:,}: not UTF-8 (byte {exc.start})") from None
        except (OSError, EOFError) as exc:  # a truncated or corrupt gzip stream
            raise TraceError(f"line {number + 1:,}: cannot read it: {exc}") from None


def example_config() -> Path:
    """The shipped example configuration: from the source tree, else the installed one."""
    here = Path(__file__).resolve().parents[2] / "slurm-conf" / "example" / "slurm-burst.toml"
    if here.is_file():
        return here
    return Path(sys.prefix) / "share" / "slurm-burst" / "example" / "slurm-burst.toml"


def config_or_example(ctx: click.Context) -> Config:
    """The site's config; where there is none (a laptop, a trial), the shipped example's
    node groups, prices and policy, said on stderr."""
    a = app(ctx)
    if a.config_path.exists():
        return a.config
    example = example_config()
    click.echo(f"note: {a.config_path} not found: using the example config {example}", err=True)
    try:
        return load_config(example)
    except ConfigError as exc:
        fail(f"the example config {example}: {exc}", EXIT_PRECONDITION)


def load_trace(trace_path: str, fmt: str, limit_factor: float) -> Trace:
    """The trace at ``trace_path`` (``fmt``: swf, alibaba, sacct or auto), or exit 2
    saying what is wrong with it and where."""
    from slurm_burst.core.workload import TraceError, parse_alibaba, parse_sacct, parse_swf

    try:
        kind, lines = _format(_read(trace_path), fmt)
        parser = {"swf": parse_swf, "alibaba": parse_alibaba, "sacct": parse_sacct}[kind]
        trace = parser(lines, trace_path, limit_factor)
    except TraceError as exc:
        fail(f"--trace {trace_path}: {exc}", EXIT_BAD_INPUT)
    if not trace.jobs:
        fail(f"--trace {trace_path}: no job that ran", EXIT_BAD_INPUT)
    return trace


def pool_of(trace: Trace, cpus: int | None, gpus: int) -> int:
    """The on-prem CPUs: ``--cpus``, else the SWF header's MaxProcs (exit 2 if neither)."""
    pool = cpus or trace.max_procs
    if pool is None:
        fail("--cpus is needed: the trace does not say how many processors it ran on",
             EXIT_BAD_INPUT)  # fmt: skip
    if trace.gpus and not gpus:
        click.echo("note: the trace has GPU jobs and --gpus is 0: they can only burst", err=True)
    return pool


def trace_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--trace, --format, --cpus, --gpus and --limit-factor (simulate, policy tune)."""
    for option in reversed(_TRACE_OPTIONS):
        f = option(f)
    return f


def _format(lines: Iterator[str], given: str) -> tuple[str, Iterator[str]]:
    """The trace's format and its lines (the first read again): given, or told by the
    first line that is not blank."""
    if given != "auto":
        return given, lines
    seen: list[str] = []
    for line in lines:
        seen.append(line)
        if line.strip():
            break
    first = seen[-1] if seen else ""
    lines = itertools.chain(seen, lines)
    if first.startswith(";") or first[:1].isspace() or first[:1] in "0123456789":
        return "swf", lines
    if first.startswith("name,") and "creation_time" in first:
        return "alibaba", lines
    if first.count("|") == 8:
        return "sacct", lines
    fail("cannot tell the trace's format: give --format swf, alibaba or sacct", EXIT_BAD_INPUT)


_TRACE_OPTIONS = [
    click.option(
        "--trace",
        "trace_path",
        required=True,
        metavar="FILE",
        help="A job trace: SWF (.swf or .swf.gz), Alibaba's GPU CSV, or sacct output.",
    ),
    click.option(
        "--format",
        "fmt",
        type=click.Choice(["auto", "swf", "alibaba", "sacct"]),
        default="auto",
        show_default=True,
        help="The trace's format.",
    ),
    click.option(
        "--cpus",
        type=Whole(1, 10_000_000),
        metavar="N",
        help="On-prem CPUs [default: the SWF header's MaxProcs].",
    ),
    click.option(
        "--gpus",
        type=Whole(0, 1_000_000),
        metavar="N",
        default=0,
        show_default=True,
        help="On-prem GPUs.",
    ),
    click.option(
        "--limit-factor",
        type=FiniteRange(1, 1000),
        default=2.0,
        show_default=True,
        help="A job's time limit where the trace has none: its run time times this.",
    ),
]


@click.command("simulate")
@trace_options
@click.option(
    "--sweep",
    metavar="F,F,...",
    default="",
    help="Also run the config's policy with each of these wait_per_dollar values "
    "(seconds of wait a dollar must save).",
)
@click.option(
    "--plot",
    "plot_dir",
    metavar="DIR",
    help="Also write wait-cdf.png and frontier.png there (needs matplotlib).",
)
@click.option(
    "--tune",
    is_flag=True,
    help="Also tune the policy on the first half of the jobs (by submit time), as "
    "`slurm-burst policy tune` does, and report never, always, policy and tuned on the "
    "second half.",
)
@json_option
@click.pass_context
def simulate(
    ctx: click.Context,
    trace_path: str,
    fmt: str,
    cpus: int | None,
    gpus: int,
    limit_factor: float,
    sweep: str,
    plot_dir: str | None,
    tune: bool,
    as_json: bool,
) -> None:  # fmt: skip
    """Replay a job trace through a model of the on-prem cluster (FCFS with EASY
    backfill) and the config's cloud node groups, under never-burst, burst-always and
    the config's [policy] (the code the daemon runs), and print for each: wait (mean,
    median, p95), bounded slowdown, cloud cost, node-hours and GPU-hours, on-prem
    utilization, and the share of burst-always's wait cut and cost. Without a site
    config, the shipped example's node groups, prices and policy are used.

    \b
    Examples:
      slurm-burst simulate --trace SDSC-SP2-1998-4.2-cln.swf.gz
      slurm-burst simulate --trace openb_pod_list_default.csv.gz --cpus 100000 --gpus 48
      sacct -a -X -P -n -S 2026-10-01 -o JobIDRaw,Account,User,Submit,Start,End,\\
        TimelimitRaw,NCPUS,AllocTRES > last-month.txt
      slurm-burst simulate --trace last-month.txt --cpus 512 --sweep 900,1800,7200 --json
      slurm-burst simulate --trace last-month.txt --cpus 512 --tune --json
    """
    from slurm_burst.services.simulation import as_json as doc_of
    from slurm_burst.services.simulation import cloud_groups, run

    try:
        factors = [float(f) for f in sweep.split(",") if f.strip()]
    except ValueError:
        fail(f"--sweep {sweep!r}: comma-separated numbers, e.g. 1800,3600,7200", EXIT_BAD_INPUT)
    if any(not 0 <= f <= 1e9 for f in factors):  # NaN fails too
        fail("--sweep: each value between 0 and 1e9 (seconds a dollar)", EXIT_BAD_INPUT)
    if tune and factors:
        fail("--tune and --sweep: one or the other (the tuning searches the values)",
             EXIT_BAD_INPUT)  # fmt: skip
    cfg = config_or_example(ctx)
    trace = load_trace(trace_path, fmt, limit_factor)
    pool = pool_of(trace, cpus, gpus)
    if tune:
        from slurm_burst.cli.policy_cmd import run_tuning

        run_tuning(trace, cfg, pool, gpus, as_json=as_json, plot_dir=plot_dir, simulate=True)
        return
    groups = cloud_groups(cfg)
    progress = Progress(enabled=not as_json or sys.stderr.isatty(), counts=True)
    rows = run(trace, cfg, pool, gpus, factors, groups, progress)
    progress.done()
    doc = doc_of(trace, pool, gpus, groups, rows)
    if plot_dir:
        from slurm_burst.wiring.storage import plot_simulation

        title = f"{Path(trace_path).name}, {pool:,} CPUs, {gpus} GPUs"
        try:
            doc["plots"] = plot_simulation(rows, title, plot_dir)
        except ImportError:
            fail("--plot needs matplotlib: pip install 'slurm-burst[sim]'", EXIT_PRECONDITION)
        except OSError as exc:
            fail(f"--plot {plot_dir}: {exc.strerror or exc}", EXIT_BAD_INPUT)
    title = f"{len(trace.jobs):,} jobs on {pool:,} CPUs, {gpus:,} GPUs ({trace_path})"
    emit_simulation(doc, as_json, gpus, title)


def emit_simulation(doc: dict[str, Any], as_json: bool, gpus: int, title: str) -> None:
    """The policies' figures: a table, or ``doc`` as JSON."""
    emit(
        doc,
        as_json,
        columns=COLUMNS,
        rows=lambda d: [
            [
                name,
                duration(p["mean_wait"]),
                duration(p["median_wait"]),
                duration(p["p95_wait"]),
                f"{p['mean_bounded_slowdown']:.1f}",
                str(p["burst_jobs"]),
                f"{p['cloud_cost']:,.0f}",
                f"{p['cloud_node_hours']:,.0f}",
                f"{p['cloud_gpu_hours']:,.0f}",
                f"{p['onprem_utilization']:.0%}",
                f"{p['onprem_gpu_utilization']:.0%}" if gpus else "-",
                "-" if p["wait_cut"] is None else f"{p['wait_cut']:.0%}",
                "-" if p["cost_share"] is None else f"{p['cost_share']:.0%}",
            ]
            for name, p in d["policies"].items()
        ],
        title=title,
    )


def duration(seconds: float) -> str:
    """Seconds under an hour, hours above (the tables' waits)."""
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds:.0f} s"
