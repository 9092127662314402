"""Local stand-ins for a deployment's services, shared by ``workflow-streams dev`` and the tests:
MinIO for S3, etcd + kube-apiserver for Kubernetes, a wait service that logs what it receives.

The Go-built binaries live in the tool cache (``$WFS_CACHE/bin``, default
``~/.cache/workflow-streams/bin``), where ``scripts/bootstrap`` builds them from their Go modules.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("WFS_CACHE") or Path.home() / ".cache" / "workflow-streams")


def cache_bin() -> Path:
    return cache_dir() / "bin"


def find_binary(name: str, env_override: str | None = None) -> Path | None:
    """``$<env_override>``, the tool cache, then PATH."""
    candidates = (os.environ.get(env_override) if env_override else None, cache_bin() / name, shutil.which(name))
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def checkout_file(relative: str, packaged: str) -> Path | None:
    """A top-level directory of the source checkout, or its copy inside the wheel (``packaged``)."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / packaged, here.parents[1] / relative):
        if candidate.exists():
            return candidate
    return None
