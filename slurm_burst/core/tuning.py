"""Tuning the burst policy on a site's own history, pure: the search over the policy's
settings, given a way to measure one (the simulator on the first part of a trace).

What is searched: ``wait_per_dollar`` (the seconds of wait a dollar must save), for each
of a few ``min_wait``, ``wait_factor`` and warm-pool sizes. For those fixed, a larger
``wait_per_dollar`` bursts fewer jobs, so the wait cut and the cost both fall as it
grows: a bisection on its logarithm finds the largest value (the cheapest setting) that
still reaches the target share of burst-always's mean-wait cut. Then the same for
``burst_share`` (the bar that follows the load), where a smaller share bursts fewer.
The best setting is the cheapest of those; every setting measured is a point of the
cost/wait frontier, which is what the command shows when no setting reaches the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Knobs:
    """One setting of the policy."""

    wait_per_dollar: float
    min_wait: float
    wait_factor: float
    warm: float = 1.0  # the config's warm pools' nodes times this (0: none)
    burst_share: float = 0.0  # the bar that follows the load (core.policy.RecentBar); 0: off


@dataclass(frozen=True)
class Point:
    """A setting, measured: its share of burst-always's mean-wait cut (None: burst-always
    cuts nothing) and of its cost, and the figures behind them."""

    knobs: Knobs
    wait_cut: float | None
    cost_share: float | None
    cost: float  # dollars
    mean_wait: float  # seconds
    p95_wait: float  # seconds

    def reaches(self, target: float) -> bool:
        return self.wait_cut is None or self.wait_cut >= target


@dataclass(frozen=True)
class Space:
    """Where to search. ``low``..``high``: seconds of wait a dollar (log scale)."""

    min_waits: tuple[float, ...] = (0.0, 600.0, 1800.0)
    wait_factors: tuple[float, ...] = (0.0, 0.5)
    warm: tuple[float, ...] = (1.0,)
    low: float = 1.0
    high: float = 1e6
    steps: int = 9  # bisections: the answer within a factor (high/low) ** (1 / 2**steps)
    shares: bool = True  # also search burst_share (each min_wait, wait_factor 0)
    share_cap: float = 3600.0  # wait_per_dollar with burst_share: the most a bar may be

    def combos(self) -> list[tuple[str, float, float, float]]:
        """Each (what to bisect, min_wait, wait_factor, warm): ``wait_per_dollar`` with
        the others fixed, or ``burst_share`` (wait_per_dollar at ``share_cap``)."""
        fixed = [("wait_per_dollar", m, f, w)
                 for w in self.warm for m in self.min_waits for f in self.wait_factors]  # fmt: skip
        shares = [("burst_share", m, 0.0, w) for w in self.warm for m in self.min_waits]
        return fixed + (shares if self.shares else [])


def bisect_wait_per_dollar(
    measure: Callable[[Knobs], Point],
    target: float,
    min_wait: float,
    wait_factor: float,
    warm: float,
    space: Space,
) -> list[Point]:
    """Every point measured while looking for the largest ``wait_per_dollar`` that
    reaches ``target`` with the other settings fixed."""

    def at(log: float) -> Point:  # three figures: what the [policy] block will say
        return measure(Knobs(float(f"{10**log:.3g}"), min_wait, wait_factor, warm))

    return _bisect(at, target, math.log10(space.high), math.log10(space.low), space.steps)


def bisect_burst_share(
    measure: Callable[[Knobs], Point], target: float, min_wait: float, warm: float, space: Space
) -> list[Point]:
    """Every point measured while looking for the smallest ``burst_share`` (the highest
    bar) that reaches ``target``; wait_per_dollar at ``space.share_cap`` caps the bar (a
    bar with no cap rises with a queue that grows without end)."""

    def at(share: float) -> Point:
        return measure(Knobs(space.share_cap, min_wait, 0.0, warm, round(share, 3)))

    return _bisect(at, target, 0.02, 0.98, max(1, space.steps - 2))  # within a hundredth


def _bisect(at: Callable[[float], Point], target: float, frugal: float, eager: float,
            steps: int) -> list[Point]:  # fmt: skip
    """Every point measured while looking for the value nearest ``frugal`` (the fewest
    bursts) that still reaches ``target``; ``eager`` bursts the most."""
    first = at(frugal)
    if first.reaches(target):
        return [first]  # the most frugal setting already does
    last = at(eager)
    points = [first, last]
    if not last.reaches(target):
        return points  # none does with these settings
    for _ in range(steps):
        mid = (frugal + eager) / 2
        p = at(mid)
        points.append(p)
        if p.reaches(target):
            eager = mid
        else:
            frugal = mid
    return points


def cheapest(points: Iterable[Point], target: float) -> Point | None:
    """The cheapest point that reaches ``target`` (the larger wait cut on a tie)."""
    good = [p for p in points if p.reaches(target)]
    return min(good, key=lambda p: (p.cost, -(p.wait_cut or 0.0)), default=None)


def frontier(points: Iterable[Point]) -> list[Point]:
    """The points no other beats on both cost and wait cut, cheapest first."""
    out: list[Point] = []
    for p in sorted(points, key=lambda p: (p.cost, -(p.wait_cut or 0.0))):
        if not out or (p.wait_cut or 0.0) > (out[-1].wait_cut or 0.0):
            out.append(p)
    return out


def best_within(points: Sequence[Point], cost_share: float) -> Point | None:
    """The largest wait cut at no more than ``cost_share`` of burst-always's cost."""
    ok = [p for p in points if p.cost_share is None or p.cost_share <= cost_share]
    return max(ok, key=lambda p: (p.wait_cut or 0.0, -p.cost), default=None)
