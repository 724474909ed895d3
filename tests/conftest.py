"""Shared test helpers."""

from __future__ import annotations

import traceback
from collections.abc import Sequence

import pytest
from click.testing import CliRunner, Result

from slurm_burst.cli.main import cli


def invoke(
    args: Sequence[str], expect: int | None = 0, env: dict[str, str] | None = None
) -> Result:
    """Run the CLI in-process; on an unexpected exit code show everything it said."""
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=True)
    if expect is not None and result.exit_code != expect:
        exc = "".join(traceback.format_exception(result.exception)) if result.exception else ""
        pytest.fail(
            f"exit {result.exit_code} (wanted {expect}) for {list(args)}\n"
            f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}\n{exc}"
        )
    return result
