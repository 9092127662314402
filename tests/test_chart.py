"""The Helm chart: lint, render, server-side validation, and the operator on exactly the chart's RBAC."""

from __future__ import annotations

import asyncio
import filecmp
import subprocess
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from tests.controlplane import CACHE_BIN, ControlPlane
from tests.test_operator import Operator, apply, hold_manifest, stream_manifest, wait_condition

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "workflow-streams"
HA = CHART / "ci" / "ha-values.yaml"


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    helm_bin = CACHE_BIN / "helm"
    if not helm_bin.is_file():
        pytest.fail("helm is not built: scripts/bootstrap builds it from its Go module")
    return subprocess.run([str(helm_bin), *args], capture_output=True, text=True, timeout=120)


def render(namespace: str, *values: Path, release: str = "wfs") -> list[dict[str, Any]]:
    extra = [arg for path in values for arg in ("-f", str(path))]
    result = helm("template", release, str(CHART), "-n", namespace, "--kube-version", "1.36.0", *extra)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_chart_crds_are_the_repository_crds() -> None:
    copies = sorted(p.name for p in (CHART / "files" / "crds").glob("*.yaml"))
    assert copies == sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    for name in copies:
        assert filecmp.cmp(REPO / "crds" / name, CHART / "files" / "crds" / name, shallow=False), name


@pytest.mark.parametrize("values", [[], [HA]], ids=["default", "ha"])
def test_lint_and_render(values: list[Path]) -> None:
    extra = [arg for path in values for arg in ("-f", str(path))]
    lint = helm("lint", str(CHART), "--strict", "--kube-version", "1.36.0", *extra)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    kinds = {doc["kind"] for doc in render("wfs", *values)}
    assert {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "Job",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
    } <= kinds
    if values:
        assert "NetworkPolicy" in kinds
        deployments = {d["metadata"]["name"]: d for d in render("wfs", *values) if d["kind"] == "Deployment"}
        assert deployments["wfs-workflow-streams-operator"]["spec"]["replicas"] == 3


@pytest.mark.parametrize("values", [[], [HA]], ids=["default", "ha"])
def test_every_rendered_object_is_accepted_by_the_api_server(
    kube: ControlPlane, values: list[Path], tmp_path: Path
) -> None:
    namespace = f"chart-{'ha' if values else 'default'}"
    kube.kubectl("create", "namespace", namespace, check=False)
    docs = render(namespace, *values)
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(crds))
    kube.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    result = kube.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(rest), check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(rest)


async def test_operator_runs_on_exactly_the_chart_rbac(
    kube: ControlPlane, namespace: str, database_url: str, s3_regions: Any, tmp_path: Path, db: asyncpg.Connection
) -> None:
    docs = render(namespace, release=f"rbac-{namespace}")
    rbac = [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(rbac))
    account = f"rbac-{namespace}-workflow-streams-operator"
    token = kube.kubectl("create", "token", "-n", namespace, account).stdout.strip()
    as_operator = kube.write_kubeconfig(tmp_path / "operator.kubeconfig", user={"token": token})

    operator = Operator(kube, namespace, database_url, s3_regions, tmp_path / "operator.log")
    operator.env["KUBECONFIG"] = str(as_operator)
    operator.start()
    try:
        apply(kube, namespace, stream_manifest("rbac", "run-rbac", "rbac"))
        await asyncio.to_thread(wait_condition, kube, namespace, "wfs/rbac", "Ready")
        apply(kube, namespace, hold_manifest("hold", "rbac"))
        await asyncio.to_thread(wait_condition, kube, namespace, "wfhold/hold", "Applied")
        kube.kubectl("delete", "-n", namespace, "wfs/rbac", "--wait=false")
        await asyncio.to_thread(wait_condition, kube, namespace, "wfs/rbac", "Deleting", "False")
        kube.kubectl("delete", "-n", namespace, "wfhold/hold")
        kube.kubectl("wait", "-n", namespace, "--for=delete", "wfs/rbac", "--timeout=60s")
        assert await db.fetchval("SELECT count(*) FROM wfs_streams") == 0
    finally:
        operator.stop()
    log = operator.log_path.read_text()
    assert "403" not in log and "Forbidden" not in log, "the operator needed more than the chart grants"

    def can(*args: str) -> bool:
        result = kube.kubectl("auth", "can-i", *args, "-n", namespace, kubeconfig=as_operator, check=False)
        return result.stdout.strip() == "yes"

    assert can("patch", "workflowstreams.workflowstreams.dev")
    assert can("patch", "workflowstreams.workflowstreams.dev", "--subresource=status")
    for denied in (
        ("get", "secrets"),
        ("create", "pods"),
        ("delete", "workflowstreams.workflowstreams.dev"),
        ("create", "streamlegalholds.workflowstreams.dev"),
        ("delete", "customresourcedefinitions"),
        ("create", "clusterrolebindings"),
    ):
        assert not can(*denied), f"the operator may {' '.join(denied)}"


def test_kind_end_to_end(tmp_path: Path) -> None:
    """Where Docker and kind exist: build the image, install the chart with a Postgres, see it Ready.
    (CI machines have no Docker engine; this runs on a developer's machine that has one.)"""
    from tests.controlplane import KindPlane, kind_available

    if not kind_available():
        pytest.skip("kind needs a running Docker engine, which this machine lacks")
    subprocess.run(["docker", "build", "-t", "workflow-streams:e2e", str(REPO)], check=True, timeout=1200)
    plane = KindPlane()
    plane.start()
    try:
        plane.cluster.load_docker_image("workflow-streams:e2e")
        plane.kubectl("create", "namespace", "wfs")
        plane.kubectl(
            "-n",
            "wfs",
            "run",
            "postgres",
            "--image=postgres:15",
            "--port=5432",
            "--env=POSTGRES_PASSWORD=e2e",
            "--labels=app=postgres",
        )
        plane.kubectl("-n", "wfs", "expose", "pod", "postgres", "--port=5432")
        plane.kubectl("-n", "wfs", "wait", "--for=condition=Ready", "pod/postgres", "--timeout=180s")
        plane.kubectl(
            "-n",
            "wfs",
            "create",
            "secret",
            "generic",
            "workflow-streams-postgres",
            "--from-literal=dsn=postgresql://postgres:e2e@postgres:5432/postgres",
        )
        install = helm(
            "install",
            "wfs",
            str(CHART),
            "-n",
            "wfs",
            "--kubeconfig",
            str(plane.kubeconfig),
            "--set",
            "image.repository=workflow-streams",
            "--set",
            "image.tag=e2e",
            "--set",
            "image.pullPolicy=Never",
            "--wait",
            "--timeout",
            "5m",
        )
        assert install.returncode == 0, install.stderr
        apply(
            plane,
            "wfs",
            stream_manifest(
                "e2e",
                "run-e2e",
                "e2e",
                placement={
                    "metadataHome": "eu-west-1",
                    "objectRegions": ["eu-west-1"],
                    "clientEgressRegions": ["eu-west-1"],
                    "logRegion": "eu-west-1",
                },
            ),
        )
        wait_condition(plane, "wfs", "wfs/e2e", "DefinitionSynced", seconds=120)
    finally:
        plane.stop()


def test_dockerfile_is_lint_clean() -> None:
    import shutil
    import sys

    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run([hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    text = (REPO / "Dockerfile").read_text()
    assert "--require-hashes" in text and "USER 10001" in text


def test_image_lock_covers_the_runtime_dependencies() -> None:
    """The image installs only requirements.lock: every runtime dependency must be pinned there."""
    import re
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [
        *project["dependencies"],
        *project["optional-dependencies"]["objects"],
        *project["optional-dependencies"]["operator"],
    ]
    locked = {
        line.split("==")[0].lower()
        for line in (REPO / "requirements.lock").read_text().splitlines()
        if "==" in line and not line.startswith(" ")
    }
    for requirement in wanted:
        name = re.split(r"[<>=\[ ;]", requirement, maxsplit=1)[0].lower()
        assert name in locked, f"{name} is missing from requirements.lock: regenerate it (see the README)"
