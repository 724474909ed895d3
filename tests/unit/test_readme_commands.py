"""The commands the README and docs/ show exist as written: every ``make`` target a
shell block names is one the Makefile has, and every ``slurm-burst`` command line names
a real command path (group, subcommand) with options that command takes. A renamed
target or command then fails here, not in a newcomer's terminal."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from slurm_burst.cli.main import cli
from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "ansible" / "README.md"]
SHELL_BLOCK = re.compile(r"^( *)```(sh|bash|console)\n(.*?)^\1```", re.M | re.S)
# what a block calls slurm-burst by: the program, or a variable set to it ($SB, ${SB[@]})
PROGRAM = re.compile(r"(?:^|/)slurm-burst$")
VARIABLE = re.compile(r"^\$\{?SB(\[@\]|\[\*\])?\}?$")


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M)}


def shell_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, command) of each shell block's lines, continuations joined,
    comments and prompts dropped."""
    text = page.read_text()
    out: list[tuple[int, str]] = []
    for block in SHELL_BLOCK.finditer(text):
        first = text.count("\n", 0, block.start(3)) + 1
        pending, start = "", first
        for offset, raw in enumerate(block.group(3).splitlines()):
            line = raw.strip()
            line = line[2:] if line.startswith("$ ") or line.startswith("# ") else line
            if not pending:
                start = first + offset
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            out.append((start, pending + line))
            pending = ""
    return out


def words(command: str) -> list[list[str]]:
    """A command line's simple commands (split at ;, &&, ||, |), each its words; a line
    the shell lexer cannot split (prose in a console block) gives none."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return []
    parts: list[list[str]] = [[]]
    for token in tokens:
        if token.startswith("#"):
            break
        if set(token) <= set(";&|"):
            parts.append([])
        else:
            parts[-1].append(token)
    return [p for p in parts if p]


def program(argv: list[str]) -> list[str]:
    """The command run and its arguments: variable settings and ``sudo`` skipped."""
    while argv and (("=" in argv[0] and not argv[0].startswith("-")) or argv[0] == "sudo"):
        argv = argv[1:]  # LAB_SLURM=24.11 make demo
    return argv


def make_targets_in(argv: list[str]) -> list[str]:
    """The targets of a ``make`` command (its options and variables skipped)."""
    argv = program(argv)
    if not argv or argv[0] != "make":
        return []
    return [w for w in argv[1:] if not w.startswith("-") and "=" not in w]


def slurm_burst_args(argv: list[str]) -> list[str] | None:
    """The arguments of a ``slurm-burst`` command, or None for another program."""
    argv = program(argv)
    if argv and (PROGRAM.search(argv[0]) or VARIABLE.match(argv[0])):
        return argv[1:]
    return None


def check_command_path(args: list[str]) -> str | None:
    """What is wrong with ``slurm-burst ARGS`` as a command path, or None. Options are
    checked against the command they follow; placeholders (``…``, ``<x>``, ``HOSTLIST``)
    end the check."""
    command: click.Command = cli
    ctx = click.Context(cli, info_name="slurm-burst")
    path = ["slurm-burst"]
    i = 0
    while i < len(args):
        word = args[i]
        if word in ("…", "...") or word.startswith(("<", "$", "`")):
            return None
        if word.startswith("-"):
            name = word.split("=", 1)[0]
            if name in ("--help", "-h"):
                return None
            option = next((p for p in command.params if name in [*p.opts, *p.secondary_opts]), None)
            if option is None:
                return f"{' '.join(path)} has no option {name}"
            takes_value = isinstance(option, click.Option) and not (option.is_flag or option.count)
            i += 2 if takes_value and "=" not in word else 1
            continue
        if not isinstance(command, click.Group):
            return None  # the command's own arguments
        sub = command.get_command(ctx, word)
        if sub is None:
            if word.split("|")[0] in command.list_commands(ctx):
                return None  # "group list|enable|warm": a choice shown, each checked apart
            return f"{' '.join(path)} has no command {word!r}"
        command, path = sub, [*path, word]
        i += 1
    return None


def cases() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for line_no, command in shell_lines(page):
            for argv in words(command):
                if make_targets_in(argv) or slurm_burst_args(argv) is not None:
                    found.append((f"{page.relative_to(ROOT)}:{line_no}", " ".join(argv)))
    return found


CASES = cases()


def test_the_readme_shows_the_two_commands() -> None:
    readme = {c for where, c in CASES if where.startswith("README.md")}
    assert "make demo" in readme and "make test" in readme


@pytest.mark.parametrize(("where", "command"), CASES, ids=[w for w, _ in CASES])
def test_each_command_shown_exists(where: str, command: str) -> None:
    argv = shlex.split(command)
    missing = set(make_targets_in(argv)) - makefile_targets()
    assert not missing, f"{where}: make has no target {sorted(missing)} ({command})"
    args = slurm_burst_args(argv)
    if args is not None:
        problem = check_command_path(args)
        assert problem is None, f"{where}: {problem} ({command})"


def test_a_stale_command_is_caught() -> None:
    """The checks themselves: a target and a command that do not exist are named."""
    assert set(make_targets_in(["make", "demo-everything"])) - makefile_targets()
    assert (
        check_command_path(["ledger", "chargeback"])
        == "slurm-burst ledger has no command 'chargeback'"
    )
    assert check_command_path(["--config", "x.toml", "nodes", "--jsn"]) == (
        "slurm-burst nodes has no option --jsn"
    )
    assert check_command_path(["--config", "x.toml", "nodes", "--json"]) is None
    assert check_command_path(["group", "list|enable|warm"]) is None
