"""A real headless Chromium for the playground test: Debian's `chromium` package, driven by Playwright
(PyPI). Playwright's own browser download is not used: the test set-up installs the browser with
apt-get when it is missing (as root, the way CI runs), or says how to."""

from __future__ import annotations

import os
import shutil
import subprocess

# Headless and quiet: no sandbox (containers, root), no GPU, no calls home.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]


def chromium() -> str:
    """The path of Debian's chromium, installed first when missing and this process may."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise RuntimeError("the playground test needs Debian's chromium: sudo apt-get install -y chromium")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=True)
        subprocess.run(install, env=env, capture_output=True, check=True)
    found = shutil.which("chromium")
    if not found:
        raise RuntimeError("apt-get installed chromium, but it is not on PATH")
    return found
