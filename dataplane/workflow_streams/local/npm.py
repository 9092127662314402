"""The npm projects the tests and the benchmark run beside the server (the Durable Streams conformance
suite, the protocol's clients, its reference server): installed with ``npm ci``, once per lockfile."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def npm_ci(project: Path, needed_for: str) -> None:
    """``npm ci`` in ``project`` unless its node_modules already holds this lockfile's packages (a stamp
    there records the lockfile it was installed from). ``needed_for`` names what needs them, for the
    error when Node.js or npm is missing."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise RuntimeError(f"Node.js and npm are needed for {needed_for} (Node 20: apt-get install nodejs npm)")
    lock = (project / "package-lock.json").read_bytes()
    stamp = project / "node_modules" / ".wfs-lock"
    if stamp.is_file() and stamp.read_bytes() == lock:
        return
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=project, check=True, timeout=600)
    stamp.write_bytes(lock)
