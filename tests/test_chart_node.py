"""The chart on a real node (tests/node.py): installed exactly as its README says, then what only a kubelet
shows: the migrations Job, probes, Services, service-account tokens through TokenReview, the operator as a
pod, legal holds, a rolling upgrade and a forced pod loss under live producers and SSE subscribers, the
PodDisruptionBudget, and two operator replicas.

One release for the module, as the README installs it (release ``wfs`` in namespace ``workflow-streams``):
the chart is one release per cluster. Postgres and MinIO run on the host and listen on the node's address,
where pods reach them; the test process reaches the data plane through its Service's ClusterIP, as pods do
(kube-proxy's rules apply to the host's own connections too).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import re
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import yaml

from tests.minio import MinioServer, minio_binary
from tests.node import FIGURES, NODE_IP, NODE_NAME, NodeCluster, NodePostgres
from tests.support import pins
from tests.test_chart import CHART, REPO, helm, readme_install_commands
from tests.test_image import CannotBuild, build_image
from tests.test_operator import stream_manifest
from tests.waiting import eventually
from workflow_streams import API_PREFIX
from workflow_streams.local.postgres import execute, find_bindir
from workflow_streams.local.process import workflow_streams
from workflow_streams.local.workload import Workload

pytestmark = [pytest.mark.slow, pytest.mark.node]
NAMESPACE = "workflow-streams"  # the README's
RELEASE = "wfs"
DEPLOYMENT = f"{RELEASE}-workflow-streams"
CLIENTS = "team-a"  # client service accounts and WorkflowStreams live here
APP = f"system:serviceaccount:{CLIENTS}:app"
HEARTBEAT_SECONDS = 2
SUBSCRIBER_IDLE_SECONDS = 5 * HEARTBEAT_SECONDS  # silence this long: the connection is dead, resume elsewhere


@dataclass
class Release:
    node: NodeCluster
    pg: NodePostgres
    database: str
    image: str
    values: Path
    service_ip: str

    @property
    def base(self) -> str:
        """The data plane's Service, as the test process reaches it (kube-proxy's ClusterIP)."""
        return f"http://{self.service_ip}"

    @property
    def dsn(self) -> str:
        return self.pg.dsn_for(self.database)

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.node.kubectl(*args, **kwargs)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def upgrade(self, *args: str) -> None:
        """``helm upgrade`` with the values in place and ``args`` more (the pre-upgrade migrations hook runs)."""
        result = helm(
            "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values", *args,
            "--kubeconfig", str(self.node.kubeconfig), cwd=REPO,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr

    def pods(self, component: str) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
        return list(self.json("get", "pods", "-n", NAMESPACE, "-l", selector)["items"])

    def token(self, account: str = "app", audience: str = "workflow-streams") -> str:
        """What the README tells a user to mint: ``kubectl create token ... --audience ...``."""
        return self.kubectl("create", "token", account, "-n", CLIENTS, f"--audience={audience}").stdout.strip()

    def ready_endpoints(self) -> int:
        slices = self.json("get", "endpointslices", "-n", NAMESPACE, "-l", f"kubernetes.io/service-name={DEPLOYMENT}")[
            "items"
        ]
        return sum(
            1
            for s in slices
            for e in s.get("endpoints") or []
            if e.get("conditions", {}).get("ready") and not e.get("conditions", {}).get("terminating")
        )

    def deployments_ready(self) -> bool:
        deployments = self.json("get", "deployments", "-n", NAMESPACE)["items"]
        return bool(deployments) and all(
            d["status"].get("observedGeneration", 0) >= d["metadata"]["generation"]
            and d["status"].get("updatedReplicas", 0) == d["spec"]["replicas"]
            and d["status"].get("availableReplicas", 0) == d["spec"]["replicas"]
            and d["status"].get("replicas", 0) == d["spec"]["replicas"]
            for d in deployments
        )

    def logs(self) -> str:
        """Every pod's log and the namespace's events, for a failure message."""
        out = [self.kubectl("get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp", check=False).stdout]
        for component in ("dataplane", "operator"):
            for pod in self.pods(component):
                name = pod["metadata"]["name"]
                log = self.kubectl("logs", "-n", NAMESPACE, name, "--tail=40", check=False)
                out.append(f"--- {name}\n{log.stdout}{log.stderr}")
        out.append(self.kubectl("get", "pods,endpointslices", "-n", NAMESPACE, "-o", "wide", check=False).stdout)
        return "\n".join(out)[-12000:]


def figure(text: str) -> None:
    FIGURES.append(text)
    print(text)


@pytest.fixture(scope="module")
def node_pg(node_cluster: NodeCluster) -> Iterator[NodePostgres]:
    bindir = find_bindir()
    assert bindir is not None, "PostgreSQL binaries not found (scripts/bootstrap)"
    cluster = NodePostgres(bindir)
    cluster.init()
    cluster.start()
    yield cluster
    cluster.destroy()


@pytest.fixture(scope="module")
def node_minio(node_cluster: NodeCluster) -> Iterator[MinioServer]:
    binary = minio_binary()
    if binary is None:
        pytest.fail("MinIO is not built: scripts/bootstrap builds it from its Go module")
    server = MinioServer(binary, host=NODE_IP)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def node_image(node_cluster: NodeCluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    """``scripts/image``'s image, imported into the node's containerd (``ctr -n k8s.io images import``)."""
    try:
        image = build_image()
    except CannotBuild as exc:
        pytest.fail(f"scripts/image cannot build here: {exc}")
    archive = tmp_path_factory.mktemp("image") / "image.tar"
    save = [image.engine, "save", "-o", str(archive), image.name]
    if image.engine == "podman":
        save[2:2] = ["--format", "docker-archive"]
    subprocess.run(save, env=image.env, check=True, capture_output=True, timeout=600)
    node_cluster.import_image(archive)
    archive.unlink()
    return image.name


def readme_steps(dsn: str, image: str) -> list[list[str]]:
    """The README's Install lines with this node's DSN and image in place of its placeholders."""
    repository, tag = image.rsplit(":", 1)
    steps = []
    for line in readme_install_commands():
        words = []
        for word in line:
            word = re.sub(r"^--from-literal=dsn=.*", f"--from-literal=dsn={dsn}", word)
            word = re.sub(r"^image\.repository=.*", f"image.repository={repository}", word)
            words.append(re.sub(r"^image\.tag=.*", f"image.tag={tag}", word))
        steps.append(words)
    return steps


@pytest.fixture(scope="module")
def release(
    node_cluster: NodeCluster,
    node_pg: NodePostgres,
    node_minio: MinioServer,
    node_image: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    node = node_cluster
    database = f"chart_{uuid.uuid4().hex[:8]}"
    asyncio.run(execute(node_pg.dsn, f"CREATE DATABASE {database}"))
    steps = readme_steps(node_pg.pod_dsn(database), node_image)
    assert [s[0] for s in steps] == ["kubectl", "kubectl", "helm"], steps
    # the test's own values: an object store (a Secret, as the values table says), a prune interval a
    # test can wait for, and heartbeats often enough that a subscriber takes a silent connection (its pod
    # deleted by force) for dead within SUBSCRIBER_IDLE_SECONDS
    values = tmp_path_factory.mktemp("values") / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "objectStore": {"existingSecret": "workflow-streams-objects"},
                "dataplane": {
                    "extraEnv": [
                        {"name": "WFS_PRUNE_INTERVAL_SECONDS", "value": "1"},
                        {"name": "WFS_SSE_HEARTBEAT_SECONDS", "value": str(HEARTBEAT_SECONDS)},
                    ]
                },
            }
        )
    )
    regions = {"eu-west-1": node_minio.region_config(f"chart-{uuid.uuid4().hex[:8]}")}
    try:
        for _tool, *args in steps[:2]:
            node.kubectl(*args)
        node.kubectl(
            "-n", NAMESPACE, "create", "secret", "generic", "workflow-streams-objects",
            f"--from-literal=regions.json={json.dumps(regions)}",
        )  # fmt: skip
        node.kubectl("create", "namespace", CLIENTS)
        node.kubectl("create", "serviceaccount", "app", "-n", CLIENTS)
        started = time.monotonic()
        install = helm(*steps[2][1:], "-f", str(values), "--kubeconfig", str(node.kubeconfig), cwd=REPO)
        installed = time.monotonic() - started
        assert install.returncode == 0, install.stderr
        service_ip = node.kubectl("get", "service", DEPLOYMENT, "-n", NAMESPACE, "-o", "jsonpath={.spec.clusterIP}")
        result = Release(node, node_pg, database, node_image, values, service_ip.stdout.strip())

        async def all_ready() -> None:
            await eventually(lambda: asyncio.to_thread(result.deployments_ready), within=180, interval=0.5,
                             message="the release's Deployments never became available")  # fmt: skip

        try:
            asyncio.run(all_ready())
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{result.logs()}") from None
        figure(
            f"helm install (README) to all Deployments Ready: {time.monotonic() - started:.1f} s"
            f" (helm install itself, with the migrations hook: {installed:.1f} s)"
        )
        yield result
    finally:
        # the streams first, while the operator runs to take its finalizers off; then the release
        for kind in ("wfhold", "wfs"):
            node.kubectl("delete", kind, "--all", "-n", CLIENTS, "--timeout=50s", check=False)
        uninstall = helm("uninstall", RELEASE, "-n", NAMESPACE, "--kubeconfig", str(node.kubeconfig), "--wait")
        node.kubectl("delete", "namespace", NAMESPACE, CLIENTS, "--timeout=50s", check=False)
        assert uninstall.returncode == 0 or "not found" in uninstall.stderr, uninstall.stderr


@pytest.fixture
async def db(release: Release) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(release.dsn)
    yield conn
    await conn.close()


def app_pins(**overrides: Any) -> dict[str, Any]:
    """Pins where the client namespace's ``app`` service account may append and read."""
    return pins(authorization={"append": [APP], "read": [APP], "ack": [APP], "close": [APP]}, **overrides)


async def test_installed_as_the_readme_says_migrates_and_becomes_ready_through_its_probes(
    release: Release, db: asyncpg.Connection
) -> None:
    # the pre-install hook Job ran `migrate` to completion (helm waited for it; it is deleted on success)
    events = release.json("get", "events", "-n", NAMESPACE, "--field-selector", "involvedObject.kind=Job")["items"]
    assert any(e["involvedObject"]["name"] == f"{DEPLOYMENT}-migrate" and e["reason"] == "Completed" for e in events), [
        e["reason"] for e in events
    ]
    assert await db.fetchval("SELECT to_regclass('wfs_streams') IS NOT NULL"), "the schema exists"
    dataplane, operator = release.pods("dataplane"), release.pods("operator")
    assert len(dataplane) == 2 and len(operator) == 1
    for pod in dataplane + operator:
        (container,) = pod["spec"]["containers"]
        assert "readinessProbe" in container and "livenessProbe" in container, container["name"]
        assert pod["spec"]["securityContext"]["runAsUser"] == 10001
        ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", pod["metadata"]["name"]
    # the Service routes to both data plane pods
    assert release.ready_endpoints() == 2
    async with aiohttp.ClientSession() as session, session.get(f"{release.base}/readyz") as resp:
        assert resp.status == 200


POD_CLIENT = r"""
import json, os, threading, urllib.request
base = os.environ["WFS_URL"] + "/api/workflow-streams/runs/pod-run/streams"
headers = {"Authorization": "Bearer " + os.environ["WFS_TOKEN"], "Content-Type": "application/json"}
def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(base + path, data, headers, method=method), timeout=30) as r:
        return r.status, json.loads(r.read())
out = {"create": call("POST", "", {"stream_id": "s", "pins": json.loads(os.environ["PINS"])})[0]}
out["append"] = [call("POST", "/s/records", {"data": {"n": n}})[1]["last_sequence"] for n in (1, 2)]
out["read"] = [r["data"] for r in call("GET", "/s/records?after=0")[1]["records"]]
seen, event = [], {}
with urllib.request.urlopen(urllib.request.Request(base + "/s/subscribe", headers=headers), timeout=30) as stream:
    threading.Thread(target=call, args=("POST", "/s/records", {"data": {"n": 3}})).start()
    for raw in stream:
        line = raw.decode().rstrip("\r\n")
        if line:
            name, _, value = line.partition(":")
            event[name] = value.lstrip(" ")
            continue
        if event.get("event") == "record":
            seen.append((int(event["id"]), json.loads(event["data"])["data"]))
        event = {}
        if len(seen) == 3:
            break
out["subscribe"] = seen
print(json.dumps(out), flush=True)
"""


async def test_a_pod_creates_appends_reads_and_subscribes_through_the_service_with_a_minted_token(
    release: Release, db: asyncpg.Connection
) -> None:
    token = release.token()  # TokenReview on the real API server decides who this is
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "client", "namespace": CLIENTS},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": "app",
            "containers": [
                {
                    "name": "client",
                    "image": release.image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-c", POD_CLIENT],
                    "env": [
                        # the Service's name, as the chart's notes give it
                        {"name": "WFS_URL", "value": f"http://{DEPLOYMENT}.{NAMESPACE}.svc"},
                        {"name": "WFS_TOKEN", "value": token},
                        {"name": "PINS", "value": json.dumps(app_pins())},
                    ],
                }
            ],
        },
    }
    release.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))

    def finished() -> str | None:
        phase = release.json("get", "pod", "client", "-n", CLIENTS)["status"].get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = await eventually(lambda: asyncio.to_thread(finished), within=120, interval=0.5, message="client pod")
    log = release.kubectl("logs", "client", "-n", CLIENTS).stdout
    assert phase == "Succeeded", log
    out = json.loads(log.strip().splitlines()[-1])
    assert out["create"] == 201
    assert out["append"] == [1, 2]
    assert out["read"] == [{"n": 1}, {"n": 2}]
    assert out["subscribe"] == [[1, {"n": 1}], [2, {"n": 2}], [3, {"n": 3}]]
    # who created and appended, as TokenReview on the API server named the token's bearer (an append by
    # the creator stores no appended_by of its own)
    principals = await db.fetch(
        """SELECT coalesce(r.appended_by, s.created_by) AS principal FROM wfs_records r
           JOIN wfs_streams s USING (stream_key) WHERE s.run_id = 'pod-run' AND s.stream_id = 's'"""
    )
    assert [r["principal"] for r in principals] == [APP] * 3
    release.kubectl("delete", "pod", "client", "-n", CLIENTS, "--wait=false")
    # a token for another audience is not the data plane's
    other = release.token(audience="https://kubernetes.default.svc.cluster.local")
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {other}"}) as session,
        session.get(f"{release.base}{API_PREFIX}/runs/pod-run/streams/s/records") as resp,
    ):
        assert resp.status == 401


def cli(*args: str, release: Release) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        workflow_streams(*args),
        capture_output=True,
        text=True,
        timeout=120,
        env={"KUBECONFIG": str(release.node.kubeconfig), "PATH": "/usr/bin:/bin"},
    )


async def wait_ready(release: Release, name: str, seconds: float = 90) -> None:
    def ready() -> bool:
        status = release.json("get", "wfs", name, "-n", CLIENTS).get("status", {})
        return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))

    await eventually(lambda: asyncio.to_thread(ready), within=seconds, interval=0.5, message=f"wfs/{name} not Ready")


async def test_the_operator_pod_reconciles_and_a_cli_hold_blocks_pruning_until_released(
    release: Release, db: asyncpg.Connection
) -> None:
    manifest = stream_manifest("held", "chart-hold", "held", authorization={"append": [APP], "read": [APP]})
    manifest["spec"]["pins"]["retention"] = {"maxRecords": 1}
    release.kubectl("apply", "-n", CLIENTS, "-f", "-", input=yaml.safe_dump(manifest))
    await wait_ready(release, "held")
    row = await db.fetchrow("SELECT retention_max_records FROM wfs_streams WHERE run_id = 'chart-hold'")
    assert row is not None and row["retention_max_records"] == 1, "the operator pod wrote the definition"

    hold = ["hold", "held", "-n", CLIENTS, "--matter", "m-1", "--reason", "litigation"]
    placed = await asyncio.to_thread(cli, *hold, "--requested-by", "legal@example.com", release=release)
    assert placed.returncode == 0, placed.stdout + placed.stderr
    held = "SELECT count(*) FROM wfs_legal_holds WHERE run_id = 'chart-hold' AND released_at IS NULL"
    assert await db.fetchval(held) == 1

    token = release.token()
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
        for n in range(3):
            url = f"{release.base}{API_PREFIX}/runs/chart-hold/streams/held/records"
            async with session.post(url, json={"data": n}) as resp:
                assert resp.status == 201, await resp.text()

    state = """SELECT count(r.*) AS records, s.next_prune_at > now() + interval '30 minutes' AS parked
               FROM wfs_streams s LEFT JOIN wfs_records r USING (stream_key)
               WHERE s.run_id = 'chart-hold' GROUP BY s.next_prune_at"""

    async def visited_while_held() -> bool:
        # a prune of a held stream parks it for an hour and removes nothing: proof the pruner came
        found = await db.fetchrow(state)
        return bool(found["parked"])

    await eventually(visited_while_held, within=30, message="the data plane's pruner never visited the stream")
    assert (await db.fetchrow(state))["records"] == 3, "the hold blocked pruning"

    released = await asyncio.to_thread(cli, "release", "held-m-1", "-n", CLIENTS, release=release)
    assert released.returncode == 0, released.stdout + released.stderr

    async def pruned() -> bool:
        return bool((await db.fetchrow(state))["records"] == 1)

    await eventually(pruned, within=30, message="pruning did not resume after the release")


async def test_readiness_follows_postgres_and_liveness_does_not(release: Release) -> None:
    """/readyz turns 503 while Postgres does not answer: the Service stops routing to the pods, which are
    not restarted; they come back when it does."""
    restarts = {
        p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"] for p in release.pods("dataplane")
    }
    release.pg.stop()
    try:
        await eventually(lambda: asyncio.to_thread(lambda: release.ready_endpoints() == 0), within=60, interval=0.5,
                         message="the data plane stayed Ready without Postgres")  # fmt: skip
    finally:
        release.pg.start()
    await eventually(lambda: asyncio.to_thread(lambda: release.ready_endpoints() == 2), within=60, interval=0.5,
                     message="the data plane did not become Ready again")  # fmt: skip
    after = {
        p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"] for p in release.pods("dataplane")
    }
    assert after == restarts, "liveness must not restart pods for a database outage"


@dataclass
class Run:
    work: Workload
    min_ready: int
    seconds: float


async def under_load(release: Release, disrupt: Callable[[], Awaitable[None]], label: str) -> Run:
    """Producers append (Idempotency-Key, retried) and SSE subscribers follow (Last-Event-ID) through the
    Service while ``disrupt`` runs; then every acknowledged append must be stored once and every subscriber
    must have seen exactly what is stored. The Service's ready endpoints are sampled all the while."""
    token = release.token()
    run_id = f"{label}-{uuid.uuid4().hex[:6]}"
    async with aiohttp.ClientSession() as session:
        work = Workload(
            session, [release.base], token, run=run_id, streams=3, request_timeout=20,
            idle_timeout=SUBSCRIBER_IDLE_SECONDS,
        )  # fmt: skip
        await work.create(app_pins())
        work.subscribe(per_stream_and_base=3)
        stop, keys = asyncio.Event(), iter(range(1_000_000))

        async def producer(n: int) -> None:
            while not stop.is_set():
                i = next(keys)
                await work.append(release.base, work.streams[i % 3], f"{run_id}-{n}-{i}")

        samples: list[int] = []

        async def sample() -> None:
            while not stop.is_set():
                samples.append(await asyncio.to_thread(release.ready_endpoints))
                await asyncio.sleep(0.2)

        tasks = [asyncio.create_task(producer(n)) for n in range(4)] + [asyncio.create_task(sample())]
        try:
            await eventually(lambda: len(work.acknowledged) >= 40, within=60, message="no appends before")
            started = time.monotonic()
            await disrupt()
            seconds = time.monotonic() - started
            before = len(work.acknowledged)
            await eventually(lambda: len(work.acknowledged) >= before + 40, within=60, message="no appends after")
            stop.set()
            await asyncio.gather(*tasks)
            try:
                await eventually(work.caught_up, within=60, message="subscribers did not catch up")
            except AssertionError as exc:
                lagging = await work.lagging()
                raise AssertionError(f"{exc}: {lagging}\n{await asyncio.to_thread(release.logs)}") from None
            problems = await work.check()
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)
            await work.close()
    stored = len(work.acknowledged)
    failed = work.attempts.failed()
    reconnected = sum(1 for s in work.subscribers if s.reconnects)
    figure(
        f"{label}: {stored} appends acknowledged, {len(problems)} problems (lost, duplicated, subscriber gaps);"
        f" {failed} attempts retried (5xx or no answer); {reconnected}/{len(work.subscribers)} subscribers resumed"
        f" with Last-Event-ID ({sum(s.reconnects for s in work.subscribers)} reconnections,"
        f" {sorted({e for s in work.subscribers for e in s.errors})}); ready endpoints never below {min(samples)};"
        f" disruption took {seconds:.1f} s"
    )
    assert problems == [], problems
    return Run(work, min(samples), seconds)


async def test_rolling_upgrade_under_load_loses_nothing(release: Release) -> None:
    before = {p["metadata"]["name"] for p in release.pods("dataplane")}

    async def rolling_upgrade() -> None:
        await asyncio.to_thread(
            release.upgrade, "--set-string", f"dataplane.podAnnotations.rollout={uuid.uuid4().hex[:8]}"
        )
        await eventually(
            lambda: asyncio.to_thread(lambda: release.deployments_ready() and not before & pod_names(release)),
            within=240, interval=0.5, message="the rollout did not finish",
        )  # fmt: skip

    run = await under_load(release, rolling_upgrade, "rolling-upgrade")
    after = pod_names(release)
    assert len(after) == 2 and not before & after, "every data plane pod was replaced"
    # every pod a subscriber was on went away: every subscriber resumed elsewhere with Last-Event-ID
    assert all(s.reconnects for s in run.work.subscribers)
    assert run.min_ready >= 1, "the PodDisruptionBudget's minAvailable: 1 held throughout"


def staying_pods(release: Release) -> list[dict[str, Any]]:
    """The data plane's pods not being deleted (one deleted may still be listed, its address answering
    nothing)."""
    return [p for p in release.pods("dataplane") if not p["metadata"].get("deletionTimestamp")]


def pod_names(release: Release) -> set[str]:
    return {p["metadata"]["name"] for p in staying_pods(release)}


async def subscriptions_open(pod_ip: str) -> int:
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(f"http://{pod_ip}:8080/metrics") as resp:
        text = await resp.text()
    return int(sum(float(m) for m in re.findall(r"^wfs_subscriptions_open(?:\{[^}]*\})? (\S+)$", text, re.M)))


async def test_a_pod_deleted_by_force_under_load_loses_nothing(release: Release) -> None:
    victim: dict[str, Any] = {}

    async def force_delete() -> None:
        pods = staying_pods(release)  # those of the rolling upgrade before may still be listed
        counts = [await subscriptions_open(p["status"]["podIP"]) for p in pods]
        victim["name"], victim["subscribers"] = max(
            ((p["metadata"]["name"], c) for p, c in zip(pods, counts, strict=True)), key=lambda x: x[1]
        )
        release.kubectl("delete", "pod", victim["name"], "-n", NAMESPACE, "--force", "--grace-period=0")
        await eventually(
            lambda: asyncio.to_thread(lambda: release.deployments_ready() and victim["name"] not in pod_names(release)),
            within=120, interval=0.5, message="the Deployment did not replace the pod",
        )  # fmt: skip

    run = await under_load(release, force_delete, "forced-deletion")
    assert victim["subscribers"] > 0, "the deleted pod served subscribers"
    assert any(s.reconnects for s in run.work.subscribers), "its subscribers resumed on the other pod"


def evict(release: Release, pod: str) -> subprocess.CompletedProcess[str]:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": NAMESPACE}}
    return release.kubectl(
        "create", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/eviction", "-f", "-",
        input=json.dumps(body), check=False,
    )  # fmt: skip


async def test_the_pdb_lets_one_data_plane_pod_be_evicted_at_a_time(release: Release) -> None:
    first, second = sorted(pod_names(release))
    assert evict(release, first).returncode == 0
    refused = evict(release, second)
    assert refused.returncode != 0 and "disruption budget" in refused.stderr, refused.stderr
    await eventually(lambda: asyncio.to_thread(release.deployments_ready), within=120, interval=0.5,
                     message="the evicted pod was not replaced")  # fmt: skip
    # a single operator replica has no budget to block a node drain with (a PDB would refuse for ever)
    (operator,) = [p["metadata"]["name"] for p in release.pods("operator")]
    assert evict(release, operator).returncode == 0
    await eventually(lambda: asyncio.to_thread(release.deployments_ready), within=120, interval=0.5,
                     message="the evicted operator was not replaced")  # fmt: skip


def peers(release: Release) -> dict[str, int]:
    """The operator replicas in the cluster-wide Kopf peering: pod name (the chart's POD_ID) -> priority."""
    status = release.json("get", "clusterkopfpeering", "workflow-streams").get("status") or {}
    return {identity: int(info["priority"]) for identity, info in status.items()}


def active_spans(log: str) -> list[tuple[float, float]]:
    """When a replica worked, from Kopf's peering lines: from "Resuming operations" to "Pausing operations"."""
    spans, since = [], None
    lines = re.findall(r"^\[([\d-]+ [\d:]+,\d+)\] \S+ +\[INFO +\] (Resuming|Pausing) operations", log, re.M)
    for stamp, what in lines:
        at = dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=dt.UTC).timestamp()
        if what == "Resuming" and since is None:
            since = at
        elif what == "Pausing" and since is not None:
            spans.append((since, at))
            since = None
    if since is not None:
        spans.append((since, float("inf")))
    return spans


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(x1, y1) - max(x0, y0)) for x0, x1 in a for y0, y1 in b)


async def test_two_operator_replicas_one_leads_the_other_takes_over(release: Release, db: asyncpg.Connection) -> None:
    """Two replicas started together with no peering object, as on an install: one leads from the start,
    the other stands by, and takes over when the leader's pod is deleted."""
    lifetime = "120"  # a missed peer would stay unseen until the next keep-alive, 110-115 s later
    await asyncio.to_thread(release.upgrade, "--set", "operator.replicas=0")
    await eventually(lambda: asyncio.to_thread(lambda: not release.pods("operator")), within=90, interval=0.5,
                     message="the operator's pods did not go")  # fmt: skip
    release.kubectl("delete", "clusterkopfpeering", "workflow-streams")
    env = ["--set", "operator.extraEnv[0].name=WFS_OPERATOR_PEERING_LIFETIME"]
    env += ["--set-string", f"operator.extraEnv[0].value={lifetime}"]
    await asyncio.to_thread(release.upgrade, "--set", "operator.replicas=2", *env)
    await eventually(lambda: asyncio.to_thread(release.deployments_ready), within=120, interval=0.5,
                     message="the operator replicas never became Ready")  # fmt: skip
    names = {p["metadata"]["name"] for p in release.pods("operator")}

    def log(pod: str) -> str:
        return release.kubectl("logs", "-n", NAMESPACE, pod, check=False).stdout

    # no hook made the peering object: a replica did, at its start, before Kopf began peering
    assert sum("created the peering object" in log(name) for name in names) == 1
    await eventually(lambda: asyncio.to_thread(lambda: set(peers(release)) == names), within=60, interval=0.5,
                     message="both replicas never showed in the peering")  # fmt: skip
    (standby, _), (leader, _) = sorted(peers(release).items(), key=lambda item: item[1])

    def reconciled(pod: str) -> int:
        return log(pod).count("Handler 'reconcile_stream' succeeded")

    counts = reconciled(leader), reconciled(standby)
    manifest = stream_manifest("first-ha", "chart-ha", "first-ha", authorization={"append": [APP], "read": [APP]})
    release.kubectl("apply", "-n", CLIENTS, "-f", "-", input=yaml.safe_dump(manifest))
    await wait_ready(release, "first-ha")
    assert reconciled(leader) > counts[0] and reconciled(standby) == counts[1], "only the leader works"
    both = overlap(active_spans(log(leader)), active_spans(log(standby)))
    figure(f"operator replicas started before their peering object: both active for {both:.2f} s")
    assert both < 30, f"both replicas worked for {both:.1f} s: the standby did not see the leader until a keep-alive"

    # the leader's pod goes and its replacement cannot be scheduled yet (as when its node is drained): the
    # standby must take over (a replacement started at once could outrank it and lead instead)
    release.kubectl("cordon", NODE_NAME)
    try:
        deleted = time.time()
        release.kubectl("delete", "pod", leader, "-n", NAMESPACE)

        def took_over() -> bool:
            return any(start >= deleted - 1 for start, _ in active_spans(log(standby)))

        await eventually(lambda: asyncio.to_thread(took_over), within=60, interval=0.5,
                         message="the standby did not take over when the leader's pod went")  # fmt: skip
        manifest = stream_manifest("second-ha", "chart-ha", "second-ha", authorization={"append": [APP], "read": [APP]})
        release.kubectl("apply", "-n", CLIENTS, "-f", "-", input=yaml.safe_dump(manifest))
        await wait_ready(release, "second-ha")
        assert reconciled(standby) > counts[1], "the standby reconciled the new stream"
    finally:
        release.kubectl("uncordon", NODE_NAME)
    assert await db.fetchval("SELECT count(*) FROM wfs_streams WHERE run_id = 'chart-ha'") == 2
    await eventually(lambda: asyncio.to_thread(release.deployments_ready), within=120, interval=0.5,
                     message="the leader's replacement never became Ready")  # fmt: skip
