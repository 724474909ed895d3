#!/usr/bin/env python3
"""Regenerate the generated sections of docs/ (or, with --check, say which have drifted).

A generated section sits between two markers in a Markdown file::

    <!-- BEGIN GENERATED: config (scripts/docs.py) -->
    ...
    <!-- END GENERATED: config -->

and is made from the code: the configuration reference from the config model's field
docs, the CLI reference from the click commands, the metrics from the daemon's
Prometheus registry, the alerts from the shipped rules. tests/unit/test_docs.py fails
when one is out of date.

    python scripts/docs.py            # rewrite them
    python scripts/docs.py --check    # exit 1 and name each stale section
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def config_reference() -> str:
    from slurm_burst.config.reference import markdown

    return markdown()


def lab_config_reference() -> str:
    from slurm_burst_lab.config import LabConfig

    from slurm_burst.config.reference import markdown

    return markdown([("[lab]", LabConfig)])


def cli_reference() -> str:
    from slurm_burst.cli.reference import markdown

    return markdown()


def metrics_reference() -> str:
    from prometheus_client.metrics import MetricWrapperBase

    from slurm_burst.adapters.metrics.prom import Metrics, SpendCollector

    out = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for m in vars(Metrics()).values():
        if isinstance(m, MetricWrapperBase):
            (family,) = m.describe()  # name, type and help, without samples
            names = m._labelnames  # no public accessor
        elif isinstance(m, SpendCollector):
            (family,) = m.collect()
            names = SpendCollector.LABELS
        else:
            continue
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = ", ".join(f"`{lb}`" for lb in names) or "—"
        out.append(f"| `{name}` | {family.type} | {labels} | {family.documentation} |")
    return "\n".join(out) + "\n"


def alerts_reference() -> str:
    import yaml

    rules = ROOT / "slurm-conf" / "prometheus" / "slurm-burst.rules.yml"
    out = ["| alert | severity | for | summary |", "|---|---|---|---|"]
    for group in yaml.safe_load(rules.read_text())["groups"]:
        for r in group["rules"]:
            if "alert" in r:
                name = r["alert"]
                link = f"[`{name}`](#{name.lower()})"
                summary = r["annotations"]["summary"].replace("|", "\\|")
                out.append(
                    f"| {link} | {r['labels']['severity']} | {r.get('for', '0s')} | {summary} |"
                )
    return "\n".join(out) + "\n"


# section name -> (file under docs/, generator)
SECTIONS: dict[str, tuple[str, Callable[[], str]]] = {
    "config": ("configuration.md", config_reference),
    "lab-config": ("lab.md", lab_config_reference),
    "cli": ("cli.md", cli_reference),
    "metrics": ("observability.md", metrics_reference),
    "alerts": ("observability.md", alerts_reference),
}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- BEGIN GENERATED: {name} \(scripts/docs.py\) -->\n)(.*?)"
        rf"(<!-- END GENERATED: {name} -->)",
        re.S,
    )


def stale(docs: Path = ROOT / "docs") -> list[str]:
    """The sections whose text in docs/ is not what the code generates now."""
    out = []
    for name, (file, make) in SECTIONS.items():
        m = _pattern(name).search((docs / file).read_text())
        if m is None or m.group(2).strip() != make().strip():
            out.append(f"{file}: {name}")
    return out


def _escaped(text: str) -> str:
    """``text`` as a literal in a re.sub replacement."""
    return text.replace("\\", "\\\\")


def write(docs: Path = ROOT / "docs") -> None:
    for name, (file, make) in SECTIONS.items():
        path = docs / file
        text = path.read_text()
        new, n = _pattern(name).subn(rf"\g<1>{_escaped(make())}\g<3>", text)
        if n != 1:
            raise SystemExit(f"{path}: no (or more than one) '{name}' section markers")
        path.write_text(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only say what is stale; exit 1 if any")
    args = ap.parse_args()
    if args.check:
        bad = stale()
        for s in bad:
            print(f"stale generated section: {s} (run python scripts/docs.py)")
        raise SystemExit(1 if bad else 0)
    write()


if __name__ == "__main__":
    main()
