"""The Kopf operator against a real kube-apiserver + etcd, driven with kubectl."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from tests.conftest import make_namespace
from tests.controlplane import ControlPlane
from tests.support import ALICE, ObjectsApi, StreamsApi
from tests.waiting import eventually
from workflow_streams.adapters.objectstore import RegionConfig
from workflow_streams.local.process import Process, workflow_streams
from workflow_streams.shells.compose import create_app
from workflow_streams.store.retention import prune_stream
from workflow_streams_operator.bucketpolicy import statement_id
from workflow_streams_operator.convert import pins_from_spec

pytestmark = pytest.mark.slow
OPERATOR = "system:workflow-streams-operator"
REPO = Path(__file__).resolve().parents[1]


class Operator:
    """``workflow-streams operator`` as its own process, watching one namespace."""

    def __init__(
        self, kube: ControlPlane, namespace: str, database_url: str, regions: dict[str, RegionConfig], log: Path
    ) -> None:
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kube.kubeconfig),
            "WFS_DATABASE_URL": database_url,
            "WFS_S3_REGIONS": json.dumps({k: dataclasses.asdict(v) for k, v in regions.items()}),
            "WFS_REGION_CIDRS": json.dumps({"eu-west-1": ["10.20.0.0/16"], "eu-central-1": ["10.30.0.0/16"]}),
            "WFS_OPERATOR_NAMESPACE": namespace,
            "WFS_OPERATOR_PEERING_LIFETIME": "10",
            "WFS_OPERATOR_METRICS_PORT": "0",
        }
        self.log_path = log
        self.process: Process | None = None

    def start(self) -> None:
        self.process = Process(workflow_streams("operator"), log=self.log_path, env=self.env, name="operator")

    def kill(self) -> None:
        """A crash: SIGKILL, no chance to finish what it was doing."""
        assert self.process is not None
        self.process.kill()
        self.process.stop()  # closes its log
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=15)


@pytest.fixture
def operator(
    kube: ControlPlane, namespace: str, database_url: str, s3_regions: Any, tmp_path: Path
) -> Iterator[Operator]:
    op = Operator(kube, namespace, database_url, s3_regions, tmp_path / "operator.log")
    op.start()
    yield op
    op.stop()
    print((tmp_path / "operator.log").read_text()[-4000:])


def stream_manifest(name: str, run: str, stream: str, **pin_overrides: Any) -> dict[str, Any]:
    pins: dict[str, Any] = {
        "direction": "output",
        "contentClass": "model_output",
        "schemaRef": "example.com/schemas/output/v1",
        "placement": {
            "metadataHome": "eu-west-1",
            "metadataReplicas": ["eu-central-1"],
            "objectRegions": ["eu-west-1"],
            "clientEgressRegions": ["eu-west-1", "eu-central-1"],
            "logRegion": "eu-west-1",
        },
        "retention": {"maxRecords": 1},
        "authorization": {
            "append": ["alice"],
            "read": ["alice"],
            "ack": ["alice"],
            "close": ["alice"],
            "legalHold": ["alice"],
        },
        "credit": {"maxUnreadItems": 1000, "maxUnreadBytes": 10_000_000, "policy": "reject"},
    }
    pins.update(pin_overrides)
    return {
        "apiVersion": "workflowstreams.dev/v1alpha1",
        "kind": "WorkflowStream",
        "metadata": {"name": name},
        "spec": {"runId": run, "streamId": stream, "pins": pins},
    }


def hold_manifest(name: str, stream: str, matter: str = "m-1") -> dict[str, Any]:
    return {
        "apiVersion": "workflowstreams.dev/v1alpha1",
        "kind": "StreamLegalHold",
        "metadata": {"name": name},
        "spec": {
            "streamRef": {"name": stream},
            "matterId": matter,
            "reason": "litigation",
            "requestedBy": "compliance@example.com",
        },
    }


def apply(
    kube: ControlPlane, namespace: str, manifest: dict[str, Any], **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    return kube.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), **kwargs)


def condition(kube: ControlPlane, namespace: str, kind_name: str, type_: str) -> dict[str, Any] | None:
    out = kube.kubectl("get", "-n", namespace, kind_name, "-o", "json").stdout
    return next((c for c in json.loads(out).get("status", {}).get("conditions", []) if c["type"] == type_), None)


async def wait_condition(
    kube: ControlPlane, namespace: str, kind_name: str, type_: str, status: str = "True", seconds: float = 60
) -> dict[str, Any]:
    def matching() -> dict[str, Any] | None:
        found = condition(kube, namespace, kind_name, type_)
        return found if found is not None and found["status"] == status else None

    return await eventually(
        lambda: asyncio.to_thread(matching),
        within=seconds,
        interval=0.3,
        message=f"{kind_name} never had {type_}={status}",
    )


async def policy_sids(s3: Any) -> set[str]:
    try:
        policy = json.loads((await s3.get_bucket_policy(Bucket=s3.bucket))["Policy"])
    except s3.exceptions.ClientError as exc:
        if exc.response["Error"]["Code"] in ("NoSuchBucketPolicy", "NoSuchPolicy"):
            return set()
        raise
    return {statement["Sid"] for statement in policy["Statement"]}


async def test_stream_reconciles_to_ready(
    kube: ControlPlane, namespace: str, operator: Operator, db: asyncpg.Connection, s3: Any
) -> None:
    apply(kube, namespace, stream_manifest("answers", "run-1", "answers"))
    ready = await wait_condition(kube, namespace, "wfs/answers", "Ready")
    assert ready["reason"] == "Reconciled" and ready["observedGeneration"] == 1
    for type_ in ("DefinitionSynced", "BucketPolicySynced"):
        assert condition(kube, namespace, "wfs/answers", type_)["status"] == "True"
    row = await db.fetchrow("SELECT pins, created_by FROM wfs_streams WHERE run_id = 'run-1'")
    assert row["created_by"] == "system:workflow-streams-operator"
    pins = json.loads(row["pins"])
    assert pins["content_class"] == "model_output"
    assert pins["placement"]["client_egress_regions"] == ["eu-west-1", "eu-central-1"]
    assert pins["authorization"]["legal_hold"] == ["alice"]
    policy = json.loads((await s3.get_bucket_policy(Bucket=s3.bucket))["Policy"])
    (statement,) = [s for s in policy["Statement"] if s["Sid"] == statement_id("run-1", "answers")]
    assert sorted(statement["Condition"]["NotIpAddress"]["aws:SourceIp"]) == ["10.20.0.0/16", "10.30.0.0/16"]
    listing = kube.kubectl("get", "-n", namespace, "wfs").stdout
    assert "answers" in listing and "run-1" in listing and "True" in listing


FIXTURES = REPO / "tests" / "fixtures" / "pins"


async def test_stored_pins_reconcile_without_conflict(
    kube: ControlPlane, namespace: str, operator: Operator, db: asyncpg.Connection
) -> None:
    """Streams an earlier release stored (tests/fixtures/pins) and their WorkflowStreams as it applied
    them: the operator resumes them as UpToDate, leaving every stored row as it was."""
    fixtures = {path.stem + "-" + path.parent.name: json.loads(path.read_text()) for path in FIXTURES.glob("*/*.json")}
    for name, fixture in fixtures.items():
        await db.execute(
            "INSERT INTO wfs_streams (run_id, stream_id, pins, pins_digest, created_by) VALUES ($1, $2, $3, $4, $5)",
            "run-old",
            name,
            json.dumps(fixture["stored"]),
            fixture["pins_digest"],
            OPERATOR,  # as the operator of an earlier release made them: before owners were recorded
        )
        manifest = stream_manifest(name, "run-old", name)
        manifest["spec"]["pins"] = fixture["spec_pins"]
        apply(kube, namespace, manifest)
    for name, fixture in fixtures.items():
        synced = await wait_condition(kube, namespace, f"wfs/{name}", "DefinitionSynced")
        assert synced["reason"] == "UpToDate", synced
        await wait_condition(kube, namespace, f"wfs/{name}", "Ready")
        status = json.loads(kube.kubectl("get", "-n", namespace, f"wfs/{name}", "-o", "json").stdout)["status"]
        assert status["pinsDigest"] == fixture["pins_digest"]
        row = await db.fetchrow("SELECT pins, pins_digest, created_by FROM wfs_streams WHERE stream_id = $1", name)
        assert json.loads(row["pins"]) == fixture["stored"] and row["created_by"] == OPERATOR
        owner = await db.fetchval("SELECT owner_name FROM wfs_streams WHERE stream_id = $1", name)
        assert owner == name, "the first object to reconcile a stream its operator made records itself as owner"


def test_kubectl_explain_teaches_the_api(kube: ControlPlane, namespace: str) -> None:
    crd = yaml.safe_load((REPO / "crds" / "workflowstreams.dev_workflowstreams.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    paths = []

    def walk(node: dict[str, Any], path: str) -> None:
        for name, prop in node.get("properties", {}).items():
            paths.append(f"{path}.{name}")
            walk(prop.get("items", prop), f"{path}.{name}")

    walk(schema, "workflowstream")
    assert len(paths) > 40
    for path in paths:
        explained = kube.kubectl("explain", path).stdout
        assert "<no description>" not in explained.split("FIELDS:")[0], path
    content_class = " ".join(kube.kubectl("explain", "workflowstream.spec.pins.contentClass").stdout.split())
    assert "use reasoning_summary for a user-visible summary" in content_class
    held = " ".join(kube.kubectl("explain", "streamlegalhold.spec.requestedBy").stdout.split())
    assert "Who asked for the hold" in held

    # the category lists both kinds; the plural only streams
    apply(kube, namespace, stream_manifest("listed", "run-l", "listed"))
    apply(kube, namespace, hold_manifest("listed-hold", "listed"))
    both = kube.kubectl("get", "-n", namespace, "workflow-streams", "-o", "name").stdout.split()
    assert set(both) == {
        "workflowstream.workflowstreams.dev/listed",
        "streamlegalhold.workflowstreams.dev/listed-hold",
    }
    streams = kube.kubectl("get", "-n", namespace, "workflowstreams", "-o", "name").stdout.split()
    assert streams == ["workflowstream.workflowstreams.dev/listed"]


def cli(*args: str, kube: ControlPlane) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workflow_streams", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KUBECONFIG": str(kube.kubeconfig)},
    )


async def test_cli_hold_waits_until_applied_and_release_until_released(
    kube: ControlPlane, namespace: str, operator: Operator, db: asyncpg.Connection
) -> None:
    apply(kube, namespace, stream_manifest("audited", "run-cli", "audited"))
    await wait_condition(kube, namespace, "wfs/audited", "Ready")
    hold = ("hold", "audited", "-n", namespace, "--matter", "M-7", "--reason", "audit", "--requested-by", "l@x")
    placed = await asyncio.to_thread(cli, *hold, kube=kube)
    assert placed.returncode == 0, placed.stderr
    assert "applied" in placed.stdout
    # the CLI returned only once the hold was in place
    assert await db.fetchval("SELECT count(*) FROM wfs_legal_holds WHERE released_at IS NULL") == 1

    released = await asyncio.to_thread(cli, "release", "audited-m-7", "-n", namespace, kube=kube)
    assert released.returncode == 0, released.stderr
    assert "released" in released.stdout
    assert await db.fetchval("SELECT count(*) FROM wfs_legal_holds WHERE released_at IS NULL") == 0
    assert kube.kubectl("get", "-n", namespace, "wfhold/audited-m-7", check=False).returncode != 0


def test_api_server_enforces_pins(kube: ControlPlane, namespace: str) -> None:
    apply(kube, namespace, stream_manifest("fixed", "run-2", "fixed"))
    changed = stream_manifest("fixed", "run-2", "fixed", direction="input")
    result = apply(kube, namespace, changed, check=False)
    assert result.returncode != 0 and "pins are immutable" in result.stderr
    moved = stream_manifest("fixed", "run-3", "fixed")
    result = apply(kube, namespace, moved, check=False)
    assert result.returncode != 0 and "runId is immutable" in result.stderr

    bad = stream_manifest("thoughts", "run-2", "thoughts", contentClass="raw_model_reasoning")
    result = apply(kube, namespace, bad, check=False)
    assert result.returncode != 0
    assert "raw hidden model reasoning is not an allowed content class" in result.stderr
    result = kube.kubectl("get", "-n", namespace, "wfs", "thoughts", check=False)
    assert result.returncode != 0 and "NotFound" in result.stderr


async def test_hold_blocks_pruning_s3_delete_and_stream_deletion(
    kube: ControlPlane,
    namespace: str,
    operator: Operator,
    db: asyncpg.Connection,
    s3: Any,
    aiohttp_client: Any,
    database_url: str,
    settings_for: Any,
    s3_regions: Any,
) -> None:
    apply(kube, namespace, stream_manifest("evidence", "run-9", "evidence"))
    await wait_condition(kube, namespace, "wfs/evidence", "Ready")
    api = StreamsApi(
        await aiohttp_client(
            create_app(settings_for(database_url, s3_regions=s3_regions, janitor_interval_seconds=0.2))
        )
    )
    sequence = await ObjectsApi(api, "run-9", "evidence").put(b"the contract", "contract")
    key = await db.fetchval(
        """SELECT r.object->>'key' FROM wfs_records r JOIN wfs_streams s USING (stream_key)
           WHERE s.run_id = 'run-9' AND s.stream_id = 'evidence' AND r.sequence = $1""",
        sequence,
    )
    await api.append("run-9", "evidence", "later")

    apply(kube, namespace, hold_manifest("matter-1", "evidence"))
    await wait_condition(kube, namespace, "wfhold/matter-1", "Applied")
    hold = await db.fetchrow("SELECT hold_id, reason, held_by FROM wfs_legal_holds")
    assert hold["held_by"] == "compliance@example.com" and hold["reason"] == "matter m-1: litigation"
    assert await prune_stream(db, "run-9", "evidence") == 0, "the hold stops pruning"
    assert (await s3.get_object_legal_hold(Bucket=s3.bucket, Key=key))["LegalHold"]["Status"] == "ON"
    await wait_condition(kube, namespace, "wfs/evidence", "LegalHold")

    kube.kubectl("delete", "-n", namespace, "wfs/evidence", "--wait=false")
    deleting = await wait_condition(kube, namespace, "wfs/evidence", "Deleting", "False")
    assert deleting["reason"] == "LegalHold"  # the operator's delete handler ran and declined
    assert kube.kubectl("get", "-n", namespace, "wfs/evidence", check=False).returncode == 0, "held: it stays"
    assert await db.fetchval("SELECT count(*) FROM wfs_streams") == 1

    kube.kubectl("delete", "-n", namespace, "wfhold/matter-1")

    def stream_gone() -> bool:
        return kube.kubectl("get", "-n", namespace, "wfs/evidence", check=False).returncode != 0

    await eventually(
        lambda: asyncio.to_thread(stream_gone), within=60, message="the stream was never deleted after the release"
    )
    assert await db.fetchval("SELECT count(*) FROM wfs_streams") == 0
    assert statement_id("run-9", "evidence") not in await policy_sids(s3), "its bucket policy statement is gone"

    async def object_deleted() -> bool:
        listing = await s3.list_object_versions(Bucket=s3.bucket, Prefix=key)
        return not listing.get("Versions")

    await eventually(object_deleted, within=30, message="the deleted stream's object stayed in S3")


async def test_restarted_operator_converges(
    kube: ControlPlane, namespace: str, operator: Operator, db: asyncpg.Connection
) -> None:
    for i in range(4):
        apply(kube, namespace, stream_manifest(f"s{i}", "run-r", f"s{i}"))
    operator.kill()  # mid-reconcile: some streams are done, some not, maybe one half-way
    operator.start()
    for i in range(4):
        await wait_condition(kube, namespace, f"wfs/s{i}", "Ready")
    assert await db.fetchval("SELECT count(*) FROM wfs_streams WHERE run_id = 'run-r'") == 4


def test_service_account_without_rbac_cannot_hold(kube: ControlPlane, namespace: str, tmp_path: Path) -> None:
    apply(kube, namespace, stream_manifest("target", "run-5", "target"))
    kube.kubectl("create", "serviceaccount", "-n", namespace, "intruder")
    kube.kubectl("create", "serviceaccount", "-n", namespace, "compliance")
    kube.kubectl(
        "create",
        "rolebinding",
        "-n",
        namespace,
        "compliance-holds",
        "--clusterrole=workflow-streams-legal-hold",
        f"--serviceaccount={namespace}:compliance",
    )

    def as_service_account(name: str) -> Path:
        token = kube.kubectl("create", "token", "-n", namespace, name).stdout.strip()
        return kube.write_kubeconfig(tmp_path / f"{name}.kubeconfig", user={"token": token})

    manifest = yaml.safe_dump(hold_manifest("sneaky", "target"))
    denied = kube.kubectl(
        "apply", "-n", namespace, "-f", "-", input=manifest, kubeconfig=as_service_account("intruder"), check=False
    )
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    allowed = kube.kubectl(
        "create", "-n", namespace, "-f", "-", input=manifest, kubeconfig=as_service_account("compliance"), check=False
    )
    assert allowed.returncode == 0, allowed.stderr
    # the hold role gives nothing on the streams themselves
    streams = kube.kubectl("get", "-n", namespace, "wfs", kubeconfig=tmp_path / "compliance.kubeconfig", check=False)
    assert streams.returncode != 0 and "forbidden" in streams.stderr.lower()


async def test_standby_replica_takes_over(
    kube: ControlPlane, namespace: str, database_url: str, s3_regions: Any, tmp_path: Path, db: asyncpg.Connection
) -> None:
    """Two replicas peer through Kopf: the higher priority one works, the other takes over when it dies."""
    active = Operator(kube, namespace, database_url, s3_regions, tmp_path / "active.log")
    standby = Operator(kube, namespace, database_url, s3_regions, tmp_path / "standby.log")
    active.env["WFS_OPERATOR_PRIORITY"], standby.env["WFS_OPERATOR_PRIORITY"] = "200", "100"
    active.start()
    assert active.process is not None
    # the active one has won the peering before the standby appears; the standby is watching, paused
    await asyncio.to_thread(active.process.wait_for_output, "Resuming operations after the pause")
    standby.start()
    assert standby.process is not None
    try:
        await asyncio.to_thread(standby.process.wait_for_output, "Initial authentication has finished")
        apply(kube, namespace, stream_manifest("first", "run-ha", "first"))
        await wait_condition(kube, namespace, "wfs/first", "Ready")
        # a later event of the active one, its 2 s hold-report timer after the reconcile: a working standby
        # would have reconciled the stream by then too
        later = r"reconcile_stream' succeeded[\s\S]*Timer 'report_legal_hold' succeeded"
        await asyncio.to_thread(active.process.wait_for_output, later)
        assert "reconcile_stream' succeeded" in active.log_path.read_text()
        assert "reconcile_stream' succeeded" not in standby.log_path.read_text(), "the standby must not work"

        active.kill()
        apply(kube, namespace, stream_manifest("second", "run-ha", "second"))
        await wait_condition(kube, namespace, "wfs/second", "Ready", "True", 90)
        assert "reconcile_stream' succeeded" in standby.log_path.read_text()
        assert await db.fetchval("SELECT count(*) FROM wfs_streams WHERE run_id = 'run-ha'") == 2
    finally:
        standby.stop()
        active.stop()


# --- tenancy: a stream belongs to the object that defined it, a run to one namespace (issue 46) ---------


@pytest.fixture
def team_b(kube: ControlPlane, database_url: str, s3_regions: Any, tmp_path: Path) -> Iterator[tuple[str, Operator]]:
    """A second namespace with an operator of its own watching it, on the same database."""
    other = make_namespace(kube)
    op = Operator(kube, other, database_url, s3_regions, tmp_path / "operator-b.log")
    op.start()
    yield other, op
    op.stop()
    print((tmp_path / "operator-b.log").read_text()[-4000:])


def events_of(kube: ControlPlane, namespace: str, name: str) -> str:
    return kube.kubectl("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}").stdout


async def test_another_namespace_cannot_claim_hold_or_delete_a_stream(
    kube: ControlPlane,
    namespace: str,
    operator: Operator,
    team_b: tuple[str, Operator],
    db: asyncpg.Connection,
    aiohttp_client: Any,
    database_url: str,
    settings_for: Any,
) -> None:
    other, _ = team_b
    apply(kube, namespace, stream_manifest("answers", "run-9", "answers"))
    await wait_condition(kube, namespace, "wfs/answers", "Ready")
    api = StreamsApi(await aiohttp_client(create_app(settings_for(database_url))))
    assert (await api.append("run-9", "answers", "kept")).status == 201

    # the same run and stream from another namespace, with the same pins: refused, and it says whose it is
    apply(kube, other, stream_manifest("other", "run-9", "answers"))
    refused = await wait_condition(kube, other, "wfs/other", "Ready", "False")
    assert refused["reason"] == "OwnedElsewhere" and namespace in refused["message"], refused
    # and a new stream in that run too: the run is the first namespace's
    apply(kube, other, stream_manifest("squat", "run-9", "fresh"))
    squat = await wait_condition(kube, other, "wfs/squat", "Ready", "False")
    assert squat["reason"] == "OwnedElsewhere" and "run run-9 belongs to namespace" in squat["message"]
    await eventually(
        lambda: asyncio.to_thread(lambda: "OwnedElsewhere" in events_of(kube, other, "other")),
        within=30,
        message="no Event told the refused object's story",
    )

    # a hold from the other namespace on its refused object does not reach the stream
    apply(kube, other, hold_manifest("sneaky", "other"))
    denied = await wait_condition(kube, other, "wfhold/sneaky", "Applied", "False")
    assert denied["reason"] == "OwnedElsewhere", denied
    assert await db.fetchval("SELECT count(*) FROM wfs_legal_holds") == 0

    # deleting the refused claimants leaves the stream, its records and its owner's Ready alone
    kube.kubectl("delete", "-n", other, "wfhold/sneaky", "wfs/other", "wfs/squat", "--timeout=60s")
    assert (await api.read_all("run-9", "answers"))[0]["data"] == "kept"
    assert await db.fetchval("SELECT owner_namespace FROM wfs_streams WHERE run_id = 'run-9'") == namespace
    assert condition(kube, namespace, "wfs/answers", "Ready")["status"] == "True"

    # within the owner's namespace a second object naming the stream is refused as well
    apply(kube, namespace, stream_manifest("twin", "run-9", "answers"))
    twin = await wait_condition(kube, namespace, "wfs/twin", "Ready", "False")
    assert twin["reason"] == "OwnedElsewhere" and "WorkflowStream" in twin["message"] and "answers" in twin["message"]
    kube.kubectl("delete", "-n", namespace, "wfs/twin", "--timeout=60s")
    assert await db.fetchval("SELECT count(*) FROM wfs_streams WHERE run_id = 'run-9'") == 1

    # the owner's own deletion still works
    kube.kubectl("delete", "-n", namespace, "wfs/answers", "--timeout=60s")
    assert await db.fetchval("SELECT count(*) FROM wfs_streams WHERE run_id = 'run-9'") == 0


async def test_a_stream_made_over_http_is_not_taken_over(
    kube: ControlPlane,
    namespace: str,
    operator: Operator,
    db: asyncpg.Connection,
    aiohttp_client: Any,
    database_url: str,
    settings_for: Any,
) -> None:
    api = StreamsApi(await aiohttp_client(create_app(settings_for(database_url))))
    manifest = stream_manifest("claim", "run-h", "made-over-http")
    http_pins = pins_from_spec(manifest["spec"]["pins"])  # the same pins, over HTTP
    resp = await api.client.post(
        api.url("run-h"), json={"stream_id": "made-over-http", "pins": http_pins}, headers=ALICE
    )
    assert resp.status == 201, await resp.text()
    apply(kube, namespace, manifest)
    refused = await wait_condition(kube, namespace, "wfs/claim", "Ready", "False")
    assert refused["reason"] == "OwnedElsewhere" and "WFS_OPERATOR_ADOPT" in refused["message"]
    kube.kubectl("delete", "-n", namespace, "wfs/claim", "--timeout=60s")
    assert await db.fetchval("SELECT count(*) FROM wfs_streams WHERE run_id = 'run-h'") == 1, "left alone"


async def test_adoption_where_the_platform_allows_it(
    kube: ControlPlane,
    namespace: str,
    database_url: str,
    s3_regions: Any,
    tmp_path: Path,
    db: asyncpg.Connection,
    aiohttp_client: Any,
    settings_for: Any,
) -> None:
    op = Operator(kube, namespace, database_url, s3_regions, tmp_path / "adopting.log")
    op.env["WFS_OPERATOR_ADOPT"] = "true"
    op.start()
    try:
        api = StreamsApi(await aiohttp_client(create_app(settings_for(database_url))))
        manifest = stream_manifest("adopter", "run-a", "adopted")
        body = {"stream_id": "adopted", "pins": pins_from_spec(manifest["spec"]["pins"])}
        assert (await api.client.post(api.url("run-a"), json=body, headers=ALICE)).status == 201
        manifest["metadata"]["annotations"] = {"workflowstreams.dev/adopt": "true"}
        apply(kube, namespace, manifest)
        await wait_condition(kube, namespace, "wfs/adopter", "Ready")
        owner = await db.fetchrow("SELECT owner_namespace, owner_name FROM wfs_streams WHERE run_id = 'run-a'")
        assert tuple(owner) == (namespace, "adopter")
    finally:
        op.stop()


async def test_a_template_reference_stores_the_resolved_pins(
    kube: ControlPlane, namespace: str, database_url: str, s3_regions: Any, tmp_path: Path, db: asyncpg.Connection
) -> None:
    op = Operator(kube, namespace, database_url, s3_regions, tmp_path / "templates.log")
    op.env["WFS_REGION"] = "eu-west-1"
    op.env["WFS_PINS_TEMPLATES"] = json.dumps(
        {"team-output": {"namespaces": [namespace], "pins": {"retention": {"max_records": 50}}}}
    )
    op.start()
    try:
        manifest = {
            "apiVersion": "workflowstreams.dev/v1alpha1",
            "kind": "WorkflowStream",
            "metadata": {"name": "templated"},
            "spec": {
                "runId": "run-tpl",
                "streamId": "out",
                "template": "team-output",
                "pins": {"credit": {"maxUnreadItems": 9}},
            },
        }
        apply(kube, namespace, manifest)
        await wait_condition(kube, namespace, "wfs/templated", "Ready")
        stored = json.loads(await db.fetchval("SELECT pins FROM wfs_streams WHERE run_id = 'run-tpl'"))
        assert stored["retention"]["max_records"] == 50 and stored["credit"]["max_unread_items"] == 9
        assert stored["authorization"]["read"] == [f"group:system:serviceaccounts:{namespace}"]
        assert stored["placement"]["client_egress_regions"] == ["eu-west-1"]
        # without a template, pins must be whole: the API server says so
        partial = {
            **manifest,
            "metadata": {"name": "partial"},
            "spec": {"runId": "run-tpl", "streamId": "p", "pins": {"direction": "output"}},
        }
        result = apply(kube, namespace, partial, check=False)
        assert result.returncode != 0 and "without a template, pins must be whole" in result.stderr
    finally:
        op.stop()
