"""Plots of a simulation (matplotlib, without a display): the wait CDF of each policy, and
cloud cost against mean wait across the policies (the frontier a sweep traces)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from slurm_burst.core.simulate import Comparison
from slurm_burst.core.tuning import Point, frontier


def plot(rows: list[Comparison], title: str, directory: str) -> list[str]:
    """Two PNGs in ``directory``: the wait CDF of each policy, and cloud cost against
    mean wait for each (the frontier the sweep traces). Returns their paths."""
    import matplotlib

    matplotlib.use("Agg")

    import matplotlib.pyplot as plt

    Path(directory).mkdir(parents=True, exist_ok=True)
    cdf = Path(directory) / "wait-cdf.png"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        n = len(r.waits)
        if n:
            hours = [max(w, 1.0) / 3600 for w in r.waits]
            ax.step(hours, [(i + 1) / n for i in range(n)], where="post", label=r.name)
    ax.set_xscale("log")
    ax.set_xlabel("wait (hours, log scale; under 1 s shown as 1 s)")
    ax.set_ylabel("share of jobs")
    ax.set_title(f"Wait CDF per policy: {title}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(cdf, dpi=110)
    plt.close(fig)
    frontier = Path(directory) / "frontier.png"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    pts = sorted((r.summary.cloud_cost, r.summary.mean_wait / 3600, r.name) for r in rows)
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color="tab:blue")
    for cost, wait, name in pts:
        ax.annotate(name, (cost, wait), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("cloud cost ($)")
    ax.set_ylabel("mean wait (hours)")
    ax.set_title(f"Cost against mean wait: {title}", fontsize=9)
    fig.tight_layout()
    fig.savefig(frontier, dpi=110)
    plt.close(fig)
    return [str(cdf), str(frontier)]


def plot_frontier(points: Sequence[Point], target: float, title: str, directory: str) -> list[str]:
    """One PNG in ``directory``: every setting the tuning measured, as its share of
    burst-always's cost against its share of the wait cut, the frontier drawn through
    them, and the target and the goal (90 % of the cut at half the cost) marked."""
    import matplotlib

    matplotlib.use("Agg")

    import matplotlib.pyplot as plt

    Path(directory).mkdir(parents=True, exist_ok=True)
    out = Path(directory) / "tuning-frontier.png"

    def xy(ps: Sequence[Point]) -> tuple[list[float], list[float]]:
        pairs = [(p.cost_share, p.wait_cut) for p in ps]
        kept = [(x, y) for x, y in pairs if x is not None and y is not None]
        return [x for x, _ in kept], [y for _, y in kept]

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(*xy(points), s=10, color="tab:gray", label="settings measured")
    ax.plot(*xy(frontier(points)), "o-", color="tab:blue", label="frontier")
    ax.axhline(target, color="tab:green", linestyle="--", linewidth=1, label="target")
    ax.axvline(0.5, color="tab:red", linestyle=":", linewidth=1, label="half the cost")
    ax.set_xlabel("cloud cost, share of burst-always's")
    ax.set_ylabel("mean-wait cut, share of burst-always's")
    ax.set_title(f"Tuning frontier: {title}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return [str(out)]
