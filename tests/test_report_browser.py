"""The HTML report in a real browser: headless Chromium (Debian package `chromium`) opens it
with no network, every chart draws, the page logs no error; a screenshot is kept under
build/test-artifacts/ for people to look at."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from conftest import REPO, skip_unless_ci

from gpufleet.model import load_fleet
from gpufleet.sim import report
from gpufleet.sim.simulator import sharing_safety, simulate
from gpufleet.sim.trace import read_native

ARTIFACTS = REPO / "build" / "test-artifacts"
CHARTS = 7


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    skip_unless_ci(
        "Chromium not found: apt-get install chromium (make system-deps does it as root)"
    )


def run_browser(
    args: list[str], page: Path | str, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on `page` (a file, or a URL such as a live server's)."""
    return subprocess.run(
        [
            browser(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            *args,
            page.as_uri() if isinstance(page, Path) else page,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_report_renders_in_chromium(tmp_path: Path) -> None:
    fleet = load_fleet([REPO / "examples" / "gitops"]).fleet
    jobs, problems = read_native(REPO / "examples" / "traces" / "demo.csv")
    assert problems == []
    jobs = jobs[:400]
    ours = simulate(fleet, jobs)
    static = simulate(fleet, jobs, policy="static-partition")
    page = tmp_path / "report.html"
    page.write_text(report.render("browser test", ours, static, sharing_safety(ours, static)))

    dom = run_browser(["--dump-dom", "--virtual-time-budget=5000"], page, tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # the page's own check: every chart has at least one drawn series
    assert f'data-charts-ok="{CHARTS}"' in dom.stdout, dom.stdout[:500]
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert any(f"{CHARTS} of {CHARTS} charts drawn" in line for line in console), dom.stderr[-2000:]
    errors = [
        line
        for line in console
        if re.search(r"Uncaught|\bError\b|Failed to load", line) and "charts drawn" not in line
    ]
    assert errors == []

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    result = run_browser(
        [f"--screenshot={shot}", "--window-size=900,2400", "--hide-scrollbars"], page, tmp_path
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # a blank page compresses to far less
