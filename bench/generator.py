"""The compiled load generator (``bench/loadgen``, Go): where its binary is, and running it.

scripts/bootstrap builds it into the cache's bin directory; ``binary()`` rebuilds it there when its
sources changed since (same stamp as bootstrap: sha256 of go.mod and the *.go files, in name order).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

SOURCES = Path(__file__).resolve().parent / "loadgen"
CACHE_BIN = Path(os.environ.get("WFS_CACHE", Path.home() / ".cache" / "workflow-streams")) / "bin"
BINARY = CACHE_BIN / "wfs-loadgen"
STAMP = CACHE_BIN / "wfs-loadgen.version"


def _stamp() -> str:
    digest = hashlib.sha256((SOURCES / "go.mod").read_bytes())
    for source in sorted(SOURCES.glob("*.go")):
        digest.update(source.read_bytes())
    return digest.hexdigest()


def binary() -> Path:
    """The generator's binary, built first if it is missing or older than its sources."""
    want = _stamp()
    if BINARY.is_file() and STAMP.is_file() and STAMP.read_text().strip() == want:
        return BINARY
    go = shutil.which("go") or "/usr/local/go/bin/go"
    CACHE_BIN.mkdir(parents=True, exist_ok=True)
    partial = CACHE_BIN / f".wfs-loadgen.{os.getpid()}"
    subprocess.run(
        [go, "build", "-trimpath", "-o", str(partial), "."],
        cwd=SOURCES,
        env={**os.environ, "CGO_ENABLED": "0", "GOWORK": "off", "GOFLAGS": "-mod=mod"},
        check=True,
    )
    partial.replace(BINARY)  # by rename: another run never starts a half-written binary
    STAMP.write_text(want + "\n")
    return BINARY


async def run(
    mode: str, base_url: str, token: str, on_phase: Callable[[str], None] | None = None, **flags: Any
) -> dict[str, Any]:
    """``wfs-loadgen <mode> -url … -token … -<flag> <value> …``; returns its JSON report.
    ``flags`` use underscores for dashes (``append_conns=8`` is ``-append-conns 8``); ``create`` takes
    pins (a dict). ``on_phase`` is called as the generator enters each phase (its "phase: x" lines),
    so the caller can sample the server over exactly the measured window."""
    args = [str(binary()), mode, "-url", base_url, "-token", token]
    for name, value in flags.items():
        if isinstance(value, dict):
            value = json.dumps(value)
        elif isinstance(value, float):
            value = f"{value:g}"
        args += [f"-{name.replace('_', '-')}", str(value)]
    proc = await asyncio.create_subprocess_exec(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    other: list[str] = []

    async def watch(stderr: asyncio.StreamReader) -> None:
        async for raw in stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith("phase: "):
                if on_phase is not None:
                    on_phase(line.removeprefix("phase: "))
            else:
                other.append(line)

    out, _ = await asyncio.gather(proc.stdout.read(), watch(proc.stderr))
    if await proc.wait() != 0:
        raise RuntimeError(f"wfs-loadgen {mode} failed ({proc.returncode}): " + "\n".join(other[-20:]))
    report: dict[str, Any] = json.loads(out) if out.strip() else {}
    return report
