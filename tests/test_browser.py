"""Open the report in headless Chromium, take a screenshot and check that the page is not blank.

Run by `nox -s browser`. Needs Debian's `chromium` package (/usr/bin/chromium; `.ci/run`
installs it); where it is absent the test is skipped with that reason. The page must render from
the file alone: Chromium starts with networking extras off and a fresh profile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")
WIDTH, HEIGHT = 1280, 6000  # a laptop-width window, tall enough to reach the head figures

pytestmark = pytest.mark.skipif(
    not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)),
    reason=f"Chromium not found at {CHROMIUM}: install Debian's `chromium` package (apt-get install chromium) "
           "or set ATTNLAB_CHROMIUM to run the browser check",
)


def screenshot(html: Path, out: Path) -> np.ndarray:
    profile = tempfile.mkdtemp(prefix="attnlab-chromium-")
    try:
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", f"--screenshot={out}", f"--window-size={WIDTH},{HEIGHT}",
             "--hide-scrollbars", html.resolve().as_uri()],
            capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert out.is_file(), f"no screenshot (exit {proc.returncode}): {proc.stderr[-2000:]}"
    with Image.open(out) as im:
        return np.asarray(im.convert("RGB"))


def test_report_renders_in_headless_chromium(tiny_run, tmp_path_factory):
    run = tiny_run
    shot_path = tmp_path_factory.mktemp("shots") / "report.png"
    pixels = screenshot(run.run_dir / "report.html", shot_path)
    assert pixels.shape == (HEIGHT, WIDTH, 3)
    flat = pixels.reshape(-1, 3).astype(int)
    # Not blank: the page background is one light grey, so a rendered page has many other pixels.
    background = np.bincount((flat[:, 0] << 16) | (flat[:, 1] << 8) | flat[:, 2]).argmax()
    not_background = ((flat[:, 0] << 16) | (flat[:, 1] << 8) | flat[:, 2]) != background
    assert not_background.mean() > 0.2, f"only {not_background.mean():.1%} of the page differs from its background"
    # The stylesheet applied: the header band across the top is dark.
    assert pixels[:40].mean() < 100, pixels[:40].mean()
    # The embedded figures decoded: saturated colour comes only from their colour maps and lines
    # (a page whose images failed shows text and greys only, well under 0.1% saturated pixels).
    saturated = (flat.max(axis=1) - flat.min(axis=1)) > 60
    assert saturated.mean() > 0.005, f"{saturated.mean():.2%} saturated pixels: the figures did not render"
