"""The README's configuration reference is generated from the model: keep it in step."""

from __future__ import annotations

from pathlib import Path

from slurm_burst.config.reference import markdown


def test_readme_has_current_config_reference() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert markdown().strip() in readme, (
        "README config reference is stale: paste `python -m slurm_burst.config.reference`"
    )
