"""Warm capacity, pure: how many nodes of a group should be joined now, by schedule.

A node group may keep a minimum of joined nodes in windows of the week (``two GPU nodes
mon-fri 08:00-20:00``), so that short interactive jobs start in seconds instead of a
boot. This module reads the windows and answers "how many now"; the daemon keeps that
many up, and the simulator models what the pool buys and costs.

A window runs from ``start`` to ``end`` on each of its days, in the controller's local
time; an ``end`` at or before ``start`` runs past midnight into the next day ("22:00" to
"06:00"); "00:00" to "24:00" is the whole day. Where windows overlap, the largest
count wins.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from slurm_burst.core.numbers import is_digits

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
WEEK = 7 * 1440  # minutes


@dataclass(frozen=True)
class Window:
    nodes: int
    days: frozenset[int]  # 0 = Monday
    start: int  # minutes after midnight
    end: int  # minutes after midnight; <= start: the next day's

    def active(self, weekday: int, minute: int) -> bool:
        if self.start < self.end:
            return weekday in self.days and self.start <= minute < self.end
        return (weekday in self.days and minute >= self.start) or (
            (weekday - 1) % 7 in self.days and minute < self.end
        )

    def minutes_a_week(self) -> int:
        span = self.end - self.start if self.start < self.end else 1440 - self.start + self.end
        return span * len(self.days)


def parse_days(text: str) -> frozenset[int]:
    """``mon-fri``, ``sat,sun``, ``mon-wed,fri``, ``fri-mon`` (wraps), ``daily``."""
    text = text.strip().lower()
    if text in ("daily", "all", "*"):
        return frozenset(range(7))
    out: set[int] = set()
    for part in text.split(","):
        first, sep, last = part.strip().partition("-")
        if first not in DAYS or (sep and last not in DAYS):
            raise ValueError(f"days {text!r}: use mon..sun, ranges (mon-fri) and commas")
        a = DAYS.index(first)
        b = DAYS.index(last) if sep else a
        out.update((a + i) % 7 for i in range((b - a) % 7 + 1))
    return frozenset(out)


def parse_clock(text: str) -> int:
    """``HH:MM`` (00:00 to 24:00) as minutes after midnight."""
    hh, sep, mm = text.strip().partition(":")
    if not sep or not (is_digits(hh) and is_digits(mm)) or len(hh) > 2 or len(mm) != 2:
        raise ValueError(f"time {text!r}: use HH:MM")
    minutes = int(hh) * 60 + int(mm)
    if int(mm) > 59 or minutes > 1440:
        raise ValueError(f"time {text!r}: between 00:00 and 24:00")
    return minutes


def window(nodes: int, days: str, start: str, end: str) -> Window:
    if not 1 <= nodes <= 100_000:
        raise ValueError(f"nodes {nodes}: between 1 and 100000")
    s, e = parse_clock(start), parse_clock(end)
    if s == e or s == 1440:
        raise ValueError(f"{start}-{end}: an empty window")
    return Window(nodes, parse_days(days), s, e % 1440 if e == 1440 and s == 0 else e)


def warm_nodes(windows: Iterable[Window], weekday: int, minute: int) -> int:
    """How many nodes the windows keep joined at ``weekday`` (0 = Monday), ``minute``."""
    return max((w.nodes for w in windows if w.active(weekday, minute)), default=0)


# -- the week as the simulator sees it: one count per minute ---------------------------------
def week_profile(windows: Iterable[Window]) -> list[int]:
    """The warm count for each minute of the week (index 0: Monday 00:00)."""
    ws = list(windows)
    return [warm_nodes(ws, m // 1440, m % 1440) for m in range(WEEK)]


def node_seconds(profile: list[int], t0: float, t1: float, origin: int) -> float:
    """Warm node-seconds between trace times ``t0`` and ``t1``; trace time 0 is minute
    ``origin`` of the week."""
    if t1 <= t0 or not any(profile):
        return 0.0
    week_total = sum(profile) * 60.0

    def upto(t: float) -> float:  # node-seconds from trace time 0 to t
        weeks, rest = divmod(t + origin * 60.0, WEEK * 60.0)
        whole, part = divmod(rest, 60.0)
        m = int(whole)
        return weeks * week_total + sum(profile[:m]) * 60.0 + profile[m % WEEK] * part

    return upto(t1) - upto(t0)


def seconds_until_below(profile: list[int], t: float, origin: int, level: int) -> float:
    """Seconds from trace time ``t`` until the warm count drops below ``level`` (inf: never
    within a week, i.e. never)."""
    start = int((t // 60 + origin) % WEEK)
    for step in range(WEEK):
        if profile[(start + step) % WEEK] < level:
            return max(0.0, step * 60.0 - (t % 60.0))
    return float("inf")


# -- the daemon's keeper: which pool nodes to power up or down now ---------------------------
@dataclass(frozen=True)
class PoolNode:
    """A node of a warm pool as Slurm shows it."""

    name: str
    up: bool  # powered up or powering up (not powered down, nor going down)
    idle: bool  # up, registered, and running nothing
    usable: bool  # not down or drained (a failed node is the reconcile loop's)


def pool_moves(
    pool: list[PoolNode], want: int, idle_for: dict[str, float], idle_limit: float
) -> tuple[list[str], list[str]]:
    """(power up, power down): the first ``want`` nodes of the pool are kept up; any
    other pool node that has been idle for ``idle_limit`` seconds is powered down, as
    Slurm would do itself if the pool were not in SuspendExcNodes."""
    up = [n.name for n in pool[:want] if n.usable and not n.up]
    down = [
        n.name for n in pool[want:] if n.up and n.idle and idle_for.get(n.name, 0.0) >= idle_limit
    ]
    return up, down
