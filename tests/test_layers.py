"""Imports point down only: the contracts in pyproject.toml ([tool.importlinter]), checked by lint-imports.

The second test proves the check can fail: it copies the packages, adds one upward import, and expects
lint-imports to name it. Without it, a contract that matched nothing (a renamed package, a typo) would pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(*, python_path: list[Path] | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if python_path is not None:
        # ahead of the editable install's own path entries, so the copies are the packages analysed
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in python_path)
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(REPO / "pyproject.toml")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_layer_contracts_hold() -> None:
    result = lint_imports()
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout, result.stdout[-3000:]


def test_an_upward_import_breaks_the_contracts(tmp_path: Path) -> None:
    for top in ("dataplane", "operator"):
        shutil.copytree(REPO / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # the store reaching up into the HTTP shell: exactly what the layers forbid
    store_db = tmp_path / "dataplane" / "workflow_streams" / "store" / "db.py"
    store_db.write_text(store_db.read_text() + "\nfrom ..api import app as _upward  # noqa\n")

    result = lint_imports(python_path=[tmp_path / "dataplane", tmp_path / "operator"])
    assert result.returncode != 0, result.stdout[-3000:]
    assert "workflow_streams.store.db -> workflow_streams.api.app" in result.stdout, result.stdout[-6000:]
