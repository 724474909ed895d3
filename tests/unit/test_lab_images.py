"""The lab's image cache: one build of an image at a time across processes (make test
builds the images beside the first lab tests, which may ask for one meanwhile)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from slurm_burst_lab import images


def test_a_second_builder_waits_for_the_first_and_then_finds_its_image(tmp_path: Path) -> None:
    root = tmp_path / "blank-bookworm"
    order: list[str] = []
    holding = threading.Event()

    def first() -> None:
        with images._one_builder(root):
            holding.set()
            time.sleep(0.3)
            (root / "etc").mkdir(parents=True)
            (root / "etc" / "slurm-burst-image.json").write_text('{"packages": []}')
            order.append("built")

    t = threading.Thread(target=first)
    t.start()
    assert holding.wait(5)
    with images._one_builder(root):  # a lock of its own open file: waits for the first
        order.append("looked")
        assert images.stamp(root) == {"packages": []}
    t.join()
    assert order == ["built", "looked"]
    assert oct((tmp_path / ".blank-bookworm.lock").stat().st_mode & 0o777) == "0o600"
