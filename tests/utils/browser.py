"""Headless Chromium for tests of web pages: the page's DOM after its scripts ran, and a screenshot.

`make test` installs Debian's `chromium` when it runs as root; elsewhere a test that needs it skips, saying so.
Screenshots go to `test-artifacts/` at the repository root (ignored by git), where CI keeps them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def chromium() -> str:
    """The Chromium binary, or skip the test with the reason."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    reason = "Chromium is not installed" + ("" if os.geteuid() == 0 else
                                             " and installing Debian's package needs root")
    pytest.skip(f"{reason} (`make test` installs it as root: apt-get install chromium)")


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                               "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)


def rendered_dom(url: str, *, wait_ms: int = 6000, timeout: float = 90.0) -> str:
    """The DOM of `url` after its scripts ran for `wait_ms` of virtual time (fetches included)."""
    done = _run([f"--virtual-time-budget={wait_ms}", "--dump-dom", url], timeout)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def screenshot(url: str, name: str, *, wait_ms: int = 6000, timeout: float = 90.0) -> Path:
    """A PNG of `url` in `test-artifacts/<name>.png`."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    path.unlink(missing_ok=True)
    _run([f"--virtual-time-budget={wait_ms}", "--window-size=1280,1100", f"--screenshot={path}", url], timeout)
    if not path.exists():
        raise RuntimeError(f"chromium wrote no screenshot of {url}")
    return path
