"""The Helm chart: lint, render, server-side validation, and the operator on exactly the chart's RBAC.
Installed for real, with pods, on the one-node cluster: tests/test_chart_node.py."""

from __future__ import annotations

import filecmp
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from tests.controlplane import CACHE_BIN, ControlPlane
from tests.test_operator import Operator, apply, hold_manifest, stream_manifest, wait_condition
from workflow_streams.domain.pins import StreamPins
from workflow_streams_operator import crdgen

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "workflow-streams"
HA = CHART / "ci" / "ha-values.yaml"
FULL = CHART / "ci" / "full-values.yaml"


def helm(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    helm_bin = CACHE_BIN / "helm"
    if not helm_bin.is_file():
        pytest.fail("helm is not built: scripts/bootstrap builds it from its Go module")
    return subprocess.run([str(helm_bin), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def render(namespace: str, *values: Path, release: str = "wfs") -> list[dict[str, Any]]:
    """``helm template`` as a user runs it: no --kube-version, so helm's offline defaults apply."""
    extra = [arg for path in values for arg in ("-f", str(path))]
    result = helm("template", release, str(CHART), "-n", namespace, *extra)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def crd_files() -> list[Path]:
    return sorted((REPO / "crds").glob("*.yaml"))


def test_committed_crds_are_what_crdgen_generates(tmp_path: Path) -> None:
    """The documented command, in its check mode, finds the committed CRDs (and the chart's copies) current."""
    command = [sys.executable, "-m", "workflow_streams_operator.crdgen"]
    check = subprocess.run([*command, "--check"], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    # and it does notice a difference
    assert subprocess.run([*command, str(tmp_path)], capture_output=True, timeout=60).returncode == 0
    stale = tmp_path / "workflowstreams.dev_workflowstreams.yaml"
    stale.write_text(stale.read_text().replace("maxUnreadItems", "maxUnreadRecords"))
    check = subprocess.run([*command, "--check", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and str(stale) in check.stderr


def test_the_crd_pins_schema_is_the_pins_model() -> None:
    crd = yaml.safe_load((REPO / "crds" / "workflowstreams.dev_workflowstreams.yaml").read_text())
    pins = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["pins"]
    assert set(pins["properties"]) == {crdgen.camel(name) for name in StreamPins.model_fields}
    credit = pins["properties"]["credit"]["properties"]
    assert credit["blockTimeoutMs"]["maximum"] == 60_000
    # with a template pins hold only what changes: nothing is required inside them, and the spec's rule
    # asks for the top-level fields of whole pins
    assert "required" not in pins and "required" not in pins["properties"]["credit"]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    (whole,) = spec["x-kubernetes-validations"]
    assert (
        whole["rule"].startswith("has(self.template) || !has(self.pins)") and "has(self.pins.credit)" in whole["rule"]
    )
    content_class = pins["properties"]["contentClass"]
    assert (
        "reasoning_summary" in content_class["description"] and "reasoningSummary" not in content_class["description"]
    )
    rules = [rule["rule"] for rule in content_class["x-kubernetes-validations"]]
    assert any("raw_model_reasoning" in rule for rule in rules)
    assert pins["x-kubernetes-validations"] == [
        {"rule": "self == oldSelf", "message": "pins are immutable; create a new stream instead"}
    ]


@pytest.mark.parametrize("path", crd_files(), ids=lambda p: p.name)
def test_every_crd_property_has_a_description(path: Path) -> None:
    for crd in yaml.safe_load_all(path.read_text()):
        names = crd["spec"]["names"]
        assert names["plural"] not in names.get("categories", []), "a category named like a plural shadows it"
        for version in crd["spec"]["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            assert crdgen.undescribed(schema) == [], f"{names['kind']}: kubectl explain would show <no description>"


def test_chart_crds_are_the_repository_crds() -> None:
    copies = sorted(p.name for p in (CHART / "files" / "crds").glob("*.yaml"))
    assert copies == sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    for name in copies:
        assert filecmp.cmp(REPO / "crds" / name, CHART / "files" / "crds" / name, shallow=False), name


def test_template_and_lint_work_with_default_values() -> None:
    """Exactly the commands a user types first: no values, no --kube-version."""
    template = helm("template", "wfs", str(CHART))
    assert template.returncode == 0, template.stderr
    lint = helm("lint", "--strict", str(CHART))
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_values_schema_refuses_mistakes(tmp_path: Path) -> None:
    for mistake in ("dataplane.replicas=two", "regoin=eu-west-1", "ingress.enabeld=true", "image.pullPolicy=Sometimes"):
        result = helm("template", "wfs", str(CHART), "--set", mistake)
        assert result.returncode != 0 and "values don't meet the specifications of the schema" in result.stderr, mistake


@pytest.mark.parametrize("values", [[], [HA], [FULL]], ids=["default", "ha", "full"])
def test_lint_and_render(values: list[Path]) -> None:
    extra = [arg for path in values for arg in ("-f", str(path))]
    lint = helm("lint", str(CHART), "--strict", *extra)
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
    if values == [HA]:
        assert "NetworkPolicy" in kinds
        deployments = {d["metadata"]["name"]: d for d in render("wfs", *values) if d["kind"] == "Deployment"}
        assert deployments["wfs-workflow-streams-operator"]["spec"]["replicas"] == 3


def test_scheduling_metadata_and_ingress_values_reach_the_objects() -> None:
    docs = render("wfs", FULL)
    pods = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]
        for d in docs
        if d["kind"] in ("Deployment", "Job")
    }
    assert set(pods) == {"dataplane", "operator", "migrations"}
    for component, pod in pods.items():
        spec = pod["spec"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}], component
        assert spec["tolerations"][0]["key"] == "dedicated", component
        assert "nodeAffinity" in spec["affinity"], component
        assert pod["metadata"]["annotations"]["example.com/team"] == "platform", component
        assert pod["metadata"]["labels"]["example.com/cost-center"] == "streams", component
    assert pods["operator"]["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux", "example.com/pool": "control"}
    assert pods["dataplane"]["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pods["operator"]["metadata"]["annotations"]["example.com/scrape"] == "true"
    (ingress,) = [d for d in docs if d["kind"] == "Ingress"]
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert ingress["spec"]["tls"][0]["secretName"] == "streams-tls"
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "streams.example.com"
    assert rule["http"]["paths"][0]["path"] == "/api/workflow-streams"
    assert rule["http"]["paths"][0]["backend"]["service"]["name"] == "wfs-workflow-streams"
    assert not [d for d in render("wfs") if d["kind"] == "Ingress"], "no Ingress unless asked for"


def readme_install_commands() -> list[list[str]]:
    """The shell lines of the chart README's Install section, continuation lines joined."""
    section = (CHART / "README.md").read_text().split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```sh\n(.*?)\n```", section, re.S)
    assert match is not None, "the chart README's Install section has no sh block"
    return [shlex.split(line) for line in match[1].replace("\\\n", " ").splitlines() if line.strip()]


def test_readme_install_steps_work_as_written(tmp_path: Path) -> None:
    """The README's commands, verbatim, on a new API server (no CRDs yet); helm install with
    --dry-run=server, as no kubelet there would run the migrations hook."""
    plane = ControlPlane(tmp_path / "kube")
    plane.start()
    try:
        installs = []
        for tool, *args in readme_install_commands():
            if tool == "kubectl":
                plane.kubectl(*args)
            else:
                assert tool == "helm" and args[0] == "install", "the README installs with kubectl and helm only"
                result = helm(*args, "--dry-run=server", "--kubeconfig", str(plane.kubeconfig), cwd=REPO)
                assert result.returncode == 0, result.stderr
                installs.append(result.stdout)
        (output,) = installs
        hooks, rest = output.split("\nHOOKS:\n", 1)[1].split("\nMANIFEST:\n", 1)
        manifest, notes = rest.split("\nNOTES:\n", 1)
        hook_docs = [d for d in yaml.safe_load_all(hooks) if d]
        (job,) = [d for d in hook_docs if d["kind"] == "Job"]
        (env,) = [e for e in job["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "WFS_DATABASE_URL"]
        secret = env["valueFrom"]["secretKeyRef"]
        # the pre-install Job finds the Secret the README created: same name, key and namespace
        data = plane.kubectl("get", "secret", "-n", job["metadata"]["namespace"], secret["name"], "-o", "json").stdout
        assert secret["key"] in yaml.safe_load(data)["data"]
        service_account = job["spec"]["template"]["spec"]["serviceAccountName"]
        assert any(d["kind"] == "ServiceAccount" and d["metadata"]["name"] == service_account for d in hook_docs), (
            "the hook Job's ServiceAccount must be a hook too: pre-install runs before the release's objects exist"
        )
        # every object of the release is accepted by the API server
        applied = plane.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest)
        assert applied.stdout.count("(server dry run)") == len([d for d in yaml.safe_load_all(manifest) if d])
        assert "http://wfs-workflow-streams.workflow-streams.svc" in notes
        assert "serviceAccountToken: {audience: workflow-streams" in notes
    finally:
        plane.stop()


@pytest.mark.parametrize("values", [[], [HA], [FULL]], ids=["default", "ha", "full"])
def test_every_rendered_object_is_accepted_by_the_api_server(
    kube: ControlPlane, values: list[Path], tmp_path: Path
) -> None:
    namespace = f"chart-{values[0].stem if values else 'default'}"
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


def test_install_leaves_crds_applied_with_kubectl_alone(kube: ControlPlane, namespace: str) -> None:
    """The project README applies crds/ with kubectl (the kube fixture did, and the legal-hold ClusterRole):
    helm install must not refuse them as "exists and cannot be imported into the current release"; the
    chart leaves them alone and its notes say so."""
    result = helm(
        "install", f"crds-{namespace}", str(CHART), "-n", namespace, "--dry-run=server",
        "--kubeconfig", str(kube.kubeconfig),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    manifest = result.stdout.split("\nMANIFEST:\n", 1)[1].split("\nNOTES:\n", 1)[0]
    kinds = [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(manifest) if d]
    assert not [k for k in kinds if k[0] == "CustomResourceDefinition"], kinds
    assert ("ClusterRole", "workflow-streams-legal-hold") not in kinds
    crds = sum(len(list(yaml.safe_load_all(path.read_text()))) for path in crd_files())
    assert f"{crds} of the {crds} CRDs were already in the cluster" in " ".join(result.stdout.split())


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
        await wait_condition(kube, namespace, "wfs/rbac", "Ready")
        apply(kube, namespace, hold_manifest("hold", "rbac"))
        await wait_condition(kube, namespace, "wfhold/hold", "Applied")
        kube.kubectl("delete", "-n", namespace, "wfs/rbac", "--wait=false")
        await wait_condition(kube, namespace, "wfs/rbac", "Deleting", "False")
        kube.kubectl("delete", "-n", namespace, "wfhold/hold")
        kube.kubectl("wait", "-n", namespace, "--for=delete", "wfs/rbac", "--timeout=60s")
        assert await db.fetchval("SELECT count(*) FROM wfs_streams") == 0
    finally:
        operator.stop()
    log = operator.log_path.read_text()
    # a 403 status, not the milliseconds of a log line's timestamp ("18:25:14,403")
    assert not re.search(r"(?<![,.\d])403(?!\d)", log) and "Forbidden" not in log, (
        "the operator needed more than the chart grants"
    )

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
