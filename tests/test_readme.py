"""The README is executed: its marked shell and Python examples run against ``workflow-streams dev --kube``,
in a shell as a user's would be after following the README: dev's export lines pasted, nothing more.

Convention: every fenced ``sh`` or ``python`` block in README.md is preceded by one marker line,
``<!-- readme-test shell -->`` (run, in document order, in one bash session), ``<!-- readme-test shell
follows -->`` (follows a stream forever: run for a few seconds, must print an event), ``<!-- readme-test
python -->`` (a complete program, run where it stands with ``python3``, twice) or ``<!-- readme-test skip:
why -->``. ``curl`` runs with ``--fail-with-body`` and the script with ``set -euo pipefail``, so an
example that the product answers with an error fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.devproc import DevProcess
from workflow_streams.local.kube import binaries_present
from workflow_streams.local.minio import minio_binary

pytestmark = pytest.mark.slow
README = Path(__file__).resolve().parents[1] / "README.md"
MARKED = re.compile(r"<!-- readme-test (?P<spec>[^>]*?) -->\n```(?P<lang>\w+)\n(?P<code>.*?)\n```\n", re.S)
FENCE = re.compile(r"^```(sh|python)$", re.M)


@dataclass(frozen=True)
class Example:
    kind: str  # shell, follows, python, skip
    code: str
    line: int


def examples(text: str) -> list[Example]:
    found = []
    for match in MARKED.finditer(text):
        spec, lang = match["spec"].strip(), match["lang"]
        line = text.count("\n", 0, match.start()) + 1
        if spec.startswith("skip:"):
            kind = "skip"
        elif spec in ("shell", "shell follows") and lang == "sh":
            kind = "follows" if spec.endswith("follows") else "shell"
        elif spec == "python" and lang == "python":
            kind = "python"
        else:
            raise AssertionError(f"README.md:{line}: unknown marker {spec!r} on a {lang} block")
        found.append(Example(kind, match["code"], line))
    return found


def test_every_example_is_marked() -> None:
    text = README.read_text()
    marked = examples(text)
    assert len(FENCE.findall(text)) == len(marked), "every sh/python block in README.md needs a readme-test marker"
    kinds = {example.kind for example in marked}
    assert {"shell", "follows", "python"} <= kinds


def user_environment() -> dict[str, str]:
    """The environment of a user's shell before following the README: nothing of dev's, and not this
    checkout's Python environment on PATH (the test runs from it; a user's shell does not, until it has
    pasted dev's export lines)."""
    scripts = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WFS_") or k in ("WFS_CACHE",)}
    for name in ("KUBECONFIG", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(name, None)
    env["PATH"] = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p and p != scripts)
    return env


def pasted_lines(dev_output: str) -> list[str]:
    """The export lines dev prints for the user's shell, as the README says to paste them."""
    lines = re.findall(r"^  (export .+)$", dev_output, re.M)
    assert lines, dev_output
    return lines


def script_for(found: list[Example], workdir: Path, port: int, pasted: list[str], python_runs: int = 2) -> str:
    """One bash script: dev's export lines as pasted, shell examples inline, Python examples (each run
    ``python_runs`` times, as a user may) and followers from files of their own."""
    lines = [
        "set -euo pipefail",
        'curl() { command curl --fail-with-body --show-error "$@"; }',
        "export -f curl",
        *pasted,
    ]
    for n, example in enumerate(found):
        code = example.code.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        lines.append(f"echo '--- README.md:{example.line} ({example.kind})'")
        if example.kind == "shell":
            lines.append(code)
        elif example.kind == "python":
            path = workdir / f"example_{n}.py"
            path.write_text(code + "\n")
            lines += [f"python3 {path.name}"] * python_runs  # the python3 the README's shell has
        elif example.kind == "follows":
            path = workdir / f"follows_{n}.sh"
            path.write_text(code + "\n")
            # it follows forever: three seconds must show an event; timeout's 124 is the expected end
            lines.append(f"status=0; timeout 3 bash {path.name} > {path.name}.out || status=$?")
            lines.append('[ "$status" = 124 ] || { echo "follower exited with $status"; exit 1; }')
            lines.append(f"grep -q '^event: record' {path.name}.out")
    return "\n".join(lines) + "\n"


def test_a_user_shell_has_no_venv_until_it_pastes_devs_lines(tmp_path: Path) -> None:
    """The premise of the test below: without dev's lines a user's shell finds no CLI and no client."""
    env = user_environment()
    check = "command -v workflow-streams || python3 -c 'import workflow_streams'"
    found = subprocess.run(["bash", "-c", check], env=env, capture_output=True, text=True, timeout=60)
    assert found.returncode != 0, found.stdout


def test_the_readme_runs_against_dev(tmp_path: Path) -> None:
    if minio_binary() is None:
        pytest.fail("MinIO is not built: scripts/bootstrap builds it (the README's object examples need it)")
    if not binaries_present():
        pytest.fail(
            "etcd/kube-apiserver are not built: scripts/bootstrap builds them (the README's Kubernetes examples)"
        )
    dev = DevProcess(tmp_path, "--kube")
    try:
        dev.wait_ready(300)
        found = [e for e in examples(README.read_text()) if e.kind != "skip"]
        (tmp_path / "readme.sh").write_text(script_for(found, tmp_path, dev.port, pasted_lines(dev.output())))
        result = subprocess.run(
            ["bash", "readme.sh"], cwd=tmp_path, env=user_environment(), capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-4000:]}\n{dev.output()[-3000:]}"
        out = result.stdout
        assert '"first_sequence": 1, "last_sequence": 2' in out, "the append example's answer"
        assert out.count("got 2 {'token': 'lo'}") == 2, "the Python example followed its stream to the end, twice"
        assert out.count("object 3 92000 bytes") == 2, "the Python example read its object back, twice"
        # the input examples' records reached dev's built-in wait service, the cluster's stream's too
        dev.wait_for_output(r"wait service: received run-1/answers #1 .*\{\"answer\": \"yes\"\}")
        dev.wait_for_output(r"wait service: received run-2/answers #1 .*\{\"answer\": \"from the cluster\"\}")
        dev.wait_for_output(r"POST /api/workflow-streams/runs/run-1/streams/cli/records 201 [\d.]+ms dev")
    finally:
        dev.stop()
