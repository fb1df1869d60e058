"""The coding agents' own command-line programs, as users install them: `@openai/codex` and
`@anthropic-ai/claude-code` from npm, at pinned versions, each installed once into the model cache
(`<cache>/agent-clis/<package>@<version>`) and reused by later runs. Where Node.js or npm is missing, or the
registry cannot be reached, the tests that need them skip with the reason."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tritongate.settings import default_cache_dir

INSTALL_TIMEOUT_S = 600


@dataclass(frozen=True)
class AgentCli:
    package: str
    version: str
    command: str  # the program's name in node_modules/.bin

    @property
    def folder(self) -> Path:
        return default_cache_dir() / "agent-clis" / f"{self.package.replace('/', '+')}@{self.version}"

    def program(self) -> Path:
        """The installed program (installed first when missing); skips the test where it cannot be."""
        binary = self.folder / "node_modules" / ".bin" / self.command
        if binary.exists():
            return binary
        missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
        if missing:
            pytest.skip(f"{self.package} needs Node.js and npm; not on the PATH: {', '.join(missing)}")
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / ".lock", "w") as lock:  # one install at a time (test runs in parallel)
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not binary.exists():
                self._install()
        return binary

    def _install(self) -> None:
        command = ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", str(self.folder),
                   f"{self.package}@{self.version}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                                  env={**os.environ, "npm_config_update_notifier": "false"})
        except subprocess.TimeoutExpired:
            pytest.skip(f"npm could not install {self.package}@{self.version} in {INSTALL_TIMEOUT_S} s")
        if done.returncode != 0:
            pytest.skip(f"npm could not install {self.package}@{self.version}: "
                        f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")


CODEX = AgentCli("@openai/codex", "0.169.0", "codex")
CLAUDE_CODE = AgentCli("@anthropic-ai/claude-code", "2.1.328", "claude")
