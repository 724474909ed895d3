"""What every command shares: exit codes, lazy collaborators, one output function."""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import click

from slurm_burst.config import Config, ConfigError, load_config
from slurm_burst.core import errors
from slurm_burst.core.numbers import is_decimal
from slurm_burst.core.records import StoreError
from slurm_burst.core.redact import redact
from slurm_burst.core.slurmsyntax import is_name
from slurm_burst.ports import NodeStore

# The exit codes: an error (core.errors.BurstError) carries its own, and the command
# group maps it in one place (cli/main.py, LazyGroup.invoke).
EXIT_OK = 0
"""The command did what was asked."""
EXIT_FAILED = errors.EXIT_FAILED
"""A step failed at run time (a Slurm command, a cloud call, a process)."""
EXIT_BAD_INPUT = errors.EXIT_BAD_INPUT
"""Bad input: usage, configuration problems, a malformed hostlist. Nothing was changed."""
EXIT_PRECONDITION = errors.EXIT_PRECONDITION
"""The command cannot run here: not root, a required program is missing, a service is down."""

EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILED: "a step failed at run time",
    EXIT_BAD_INPUT: "bad input (usage, config, hostlist); nothing changed",
    EXIT_PRECONDITION: "cannot run here (not root, missing program, a service down)",
}


@dataclass
class AppContext:
    """Built once per invocation; collaborators are created on first use."""

    config_path: Path
    verbose: int = 0
    check_drivers: bool = True
    _config: Config | None = field(default=None, repr=False)

    @property
    def config(self) -> Config:
        if self._config is None:
            try:
                self._config = load_config(
                    self.config_path, driver_exists=_driver_exists if self.check_drivers else None
                )
            except ConfigError as exc:
                for p in exc.problems:
                    click.echo(p.render(exc.source), err=True)
                fail(
                    f"configuration {exc.source} has {len(exc.problems)} problem(s); "
                    "run 'slurm-burst config check' for details",
                    EXIT_BAD_INPUT,
                )
        return self._config


def _driver_exists(name: str) -> bool:
    from slurm_burst.wiring.clouds import driver_exists

    return driver_exists(name)


def app(ctx: click.Context) -> AppContext:
    obj = ctx.find_object(AppContext)
    assert obj is not None, "main() sets the AppContext"
    return obj


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    click.echo(f"slurm-burst: error: {redact(message)}", err=True)
    sys.exit(code)


class RedactFilter(logging.Filter):
    """Every log record with its secrets (URL passwords, ``password=``) masked."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


def redact_logs() -> None:
    """Put :class:`RedactFilter` on every handler of the root logger (once each)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactFilter) for f in handler.filters):
            handler.addFilter(RedactFilter())


def emit(
    data: Any,
    as_json: bool,
    *,
    columns: Sequence[str] | None = None,
    rows: Callable[[Any], Sequence[Sequence[Any]]] | None = None,
    title: str | None = None,
) -> None:
    """Print ``data`` as JSON for scripts, or as a table for people."""
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
        return
    if columns is None or rows is None:
        click.echo(str(data))
        return
    from rich.console import Console  # imported here: the hooks never print tables
    from rich.table import Table

    table = Table(title=title, show_lines=False, header_style="bold")
    for col in columns:
        table.add_column(col)
    for row in rows(data):
        table.add_row(*(("" if v is None else str(v)) for v in row))
    # piped (make demo, a log): do not squeeze the table into rich's default 80 columns
    Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200).print(table)


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def state_store(ctx: click.Context) -> NodeStore:
    """The daemon's state database, read-only use (exit 3 if there is none)."""
    from slurm_burst.wiring.light import node_store

    try:
        return node_store(app(ctx).config, create=False)
    except StoreError as exc:
        fail(str(exc), EXIT_PRECONDITION)


_WHOLE = re.compile(r"-?[0-9]{1,19}", re.ASCII)


class Whole(click.IntRange):
    """click's IntRange, reading ASCII digits only, nothing around them: ``int()`` under
    it takes '٣', '1_0', '+7' and ' 7\\n' (docs/operations.md, "Input bounds"). Every
    whole-number option uses it."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and _WHOLE.fullmatch(value) is None:
            self.fail(f"{shown(value)} is not a whole number (ASCII digits).", param, ctx)
        return super().convert(value, param, ctx)


class FiniteRange(click.FloatRange):
    """click's FloatRange, reading ASCII digits, a point and an exponent only, nothing
    around them (``float()`` under it takes '٣', '1_0', 'nan' and 'inf'). Every decimal
    option uses it."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and (value != value.strip() or not is_decimal(value)):
            self.fail(f"{shown(value)} is not a finite number (ASCII digits, a point).", param, ctx)
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class SlurmName(click.types.StringParamType):
    """A Slurm account or QOS name, compared as Slurm compares them: without regard to
    case (given lower-cased). Anything that is not a name (a byte that is not UTF-8, a
    control character, a blank) is refused, never passed on; "" stays "" (no filter)."""

    name = "name"

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "":
            return value
        if not isinstance(value, str) or not is_name(value):
            self.fail(
                f"{shown(str(value))} is not a Slurm {self.what} name (ASCII letters, digits, "
                "_ and -, at most 64)",
                param,
                ctx,
            )
        return value.lower()


def shown(text: str) -> str:
    """``text`` for an error message: quoted, at most 40 characters, every byte that is
    not printable ASCII escaped (a control character never reaches the terminal)."""
    short = text[:40] + ("..." if len(text) > 40 else "")
    return ascii(short)


def ts(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if t else ""


class Progress:
    """One line on stderr, rewritten at most five times a second: step, share, bytes
    (``counts``: step, done of total)."""

    def __init__(self, enabled: bool, counts: bool = False) -> None:
        self.enabled = enabled
        self.counts = counts
        self.last = 0.0
        self.shown = False

    def __call__(self, step: str, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last < 0.2 and done < total):
            return
        self.last = now
        share = 100.0 * done / total if total else 100.0
        mb = f"{share:5.1f}% of {total / 1e6:,.1f} MB"
        said = f"{done:,} of {total:,}" if self.counts else mb
        click.echo(f"\r{f'{step}: {said}':<72}", nl=False, err=True)
        self.shown = True

    def done(self) -> None:
        if self.shown:
            click.echo("", err=True)
