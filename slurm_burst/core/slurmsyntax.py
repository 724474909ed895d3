"""What Slurm's configuration parser accepts, for every value slurm-burst writes into
slurm.conf and gres.conf. Pure: stdlib only.

Slurm reads its files line by line (``src/common/parse_config.c``): a ``\\`` at the end
of a line continues it; ``#`` not escaped by a backslash starts a comment; the rest is
``Key=Value`` pairs separated by whitespace, a key being letters, digits, ``_`` and
``.``, a value either a run of non-blank characters or ``"quoted"`` (no quote inside).
So a newline in a value starts a new setting, a blank splits it into two, a ``#`` cuts
it short, and a quote swallows what follows. Everything we write must therefore be a
value of the kind its key expects (a name, an absolute path, a time, a list of names)
in plain ASCII, and :func:`tokenize` reads a rendered file back the way Slurm would, so
the renderer can check it wrote exactly the settings it meant.

Every pattern here is matched whole (``fullmatch``) and ASCII-only: ``$`` would accept
a trailing newline and ``\\d`` would accept digits of other scripts, which Slurm's
``atoi`` reads as a stop.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from slurm_burst.core.errors import BadInput

# Characters no setting of ours ever means: C0/C1 controls (newline, NUL, ESC, DEL, ...),
# Unicode line and paragraph separators (Python's splitlines breaks on them) and format
# characters (bidirectional overrides that make a file read otherwise than it parses).
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})

NAME_MAX = 64  # a hostname's length (HOST_NAME_MAX); our partition and account names too
PATH_MAX = 1024

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*", re.ASCII)
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)
_FEATURE = re.compile(r"[A-Za-z0-9_.-]+", re.ASCII)
# An absolute path Slurm can take unquoted and we need not escape: no blank, '#', quote,
# backslash, '=', ',' (list separator) or '%' (Slurm expands %n, %h in some paths).
_PATH = re.compile(r"/[A-Za-z0-9._+@/-]*", re.ASCII)
# gres.conf File=: a path whose last part may hold a hostlist range (/dev/nvidia[0-3])
_DEVICE_PATH = re.compile(r"/[A-Za-z0-9._+@/-]*(?:\[[0-9,-]+\][A-Za-z0-9._-]*)?", re.ASCII)
# Slurm's time_str2mins: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or unlimited
_TIME = re.compile(
    r"(?:INFINITE|UNLIMITED|infinite|unlimited"
    r"|[0-9]{1,9}(?::[0-9]{1,2}){0,2}"
    r"|[0-9]{1,6}-[0-9]{1,2}(?::[0-9]{1,2}){0,2})",
    re.ASCII,
)
_KEY = re.compile(r"[A-Za-z0-9_.]+", re.ASCII)
# One Key=Value of Slurm's keyvalue_pattern: optional operator, quoted or bare value.
_PAIR = re.compile(r"\s*([A-Za-z0-9_.]+)\s*([-*+/]?)=\s*(?:\"([^\"]*)\"|(\S+))(?:\s+|\Z)", re.ASCII)
_INCLUDE = re.compile(r"\s*include\s+(\S+)\s*", re.ASCII | re.IGNORECASE)


class SlurmSyntaxError(BadInput, ValueError):
    """A value that Slurm would read otherwise than meant; the message says which and why."""

    code = "SlurmSyntax"


def hidden_character(text: str) -> str | None:
    """The first control, separator or format character in ``text``, as people read it
    (``'\\n'``, ``U+202E``); None if there is none."""
    for ch in text:
        if unicodedata.category(ch) in _HIDDEN:
            return repr(ch) if ch.isascii() else f"U+{ord(ch):04X}"
    return None


def visible(text: str) -> str:
    """``text`` with every hidden character escaped (``\\n``, ``\\u202e``): safe to print
    on one line of a terminal or a log."""
    if hidden_character(text) is None:
        return text
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in _HIDDEN else ch
        for ch in text
    )


def is_name(text: str) -> bool:
    """A Slurm partition, account or QOS name as we allow it: ASCII letters, digits,
    '-' and '_', starting with a letter or digit, at most 64 characters."""
    return len(text) <= NAME_MAX and _NAME.fullmatch(text) is not None


def is_node_name(text: str) -> bool:
    """One node name (also '.'): what a hostname may be."""
    return len(text) <= NAME_MAX and _NODE_NAME.fullmatch(text) is not None


def is_feature(text: str) -> bool:
    return len(text) <= NAME_MAX and _FEATURE.fullmatch(text) is not None


def is_path(text: str) -> bool:
    """An absolute path Slurm reads as it is: ASCII letters, digits and ``._+@/-``."""
    return len(text) <= PATH_MAX and _PATH.fullmatch(text) is not None


def is_device_path(text: str) -> bool:
    return len(text) <= PATH_MAX and _DEVICE_PATH.fullmatch(text) is not None


def is_time(text: str) -> bool:
    """A Slurm time limit (MaxTime=): minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]], or
    INFINITE/UNLIMITED."""
    return _TIME.fullmatch(text) is not None


def word(value: object, key: str) -> str:
    """``value`` as the bare (unquoted) value of ``key``: refused when Slurm would read
    anything else from it (a blank, '#', a quote, a backslash, a control character)."""
    text = str(value)
    bad = hidden_character(text)
    if bad or not text or not text.isascii() or any(c in text for c in ' \t"#\\'):
        why = (
            f"holds {bad}"
            if bad
            else "is empty"
            if not text
            else "holds a blank, '#', a quote, \\ or non-ASCII"
        )
        raise SlurmSyntaxError(f"{key}={text!r} {why}: Slurm would read another setting")
    return text


def comment(text: str) -> str:
    """Text that stays inside one comment line (no line break, no hidden character)."""
    bad = hidden_character(text)
    if bad:
        raise SlurmSyntaxError(f"{text!r} holds {bad}: it would break out of a comment line")
    return text


@dataclass(frozen=True)
class Setting:
    """One ``Key=Value`` as Slurm reads it: its line, the key (case kept), the operator
    ('' for '=', or '+', '-', '*', '/') and the value (quotes removed)."""

    line: int
    key: str
    value: str
    op: str = ""


def _strip_comment(line: str) -> str:
    """The line up to a '#' that an even number of backslashes precede (Slurm's rule)."""
    slashes = 0
    for i, ch in enumerate(line):
        if ch == "#" and slashes % 2 == 0:
            return line[:i]
        slashes = slashes + 1 if ch == "\\" else 0
    return line


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) with continuation lines joined and comments removed.
    Only '\\n' breaks a line: Slurm's reader knows no other separator."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.split("\n"), start=1):
        line = _strip_comment(raw.removesuffix("\r"))
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        out.append((start, "".join(pending)))
        pending = []
    if pending:
        out.append((start, "".join(pending)))
    return out


def tokenize(text: str) -> list[list[Setting]]:
    """Each non-empty line of a Slurm configuration file as the settings Slurm reads from
    it; ``Include FILE`` is the setting ``Include``. SlurmSyntaxError names a line Slurm
    would refuse."""
    lines: list[list[Setting]] = []
    for number, line in _logical_lines(text):
        if not line.strip():
            continue
        inc = _INCLUDE.fullmatch(line)
        if inc:
            lines.append([Setting(number, "Include", inc.group(1))])
            continue
        settings: list[Setting] = []
        pos = 0
        while pos < len(line) and line[pos:].strip():
            m = _PAIR.match(line, pos)
            if m is None:
                raise SlurmSyntaxError(f"line {number}: Slurm cannot parse {line[pos:][:60]!r}")
            value = m.group(3) if m.group(3) is not None else m.group(4)
            settings.append(Setting(number, m.group(1), value.replace("\\", ""), m.group(2)))
            pos = m.end()
        lines.append(settings)
    return lines
