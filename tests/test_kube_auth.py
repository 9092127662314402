"""Real service accounts on the real API server: TokenReview decides who a caller is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.controlplane import ControlPlane, _key, _pem_key, sign_service_account_token
from tests.support import StreamsApi, problem
from workflow_streams.api.kubeauth import KubeAuthSettings
from workflow_streams.shells.compose import create_app

pytestmark = pytest.mark.slow
AUDIENCE = "workflow-streams"


def token(kube: ControlPlane, namespace: str, name: str, audience: str = AUDIENCE) -> str:
    return kube.kubectl("create", "token", "-n", namespace, name, f"--audience={audience}").stdout.strip()


@pytest.fixture
async def sa_api(
    kube: ControlPlane, namespace: str, aiohttp_client: Any, database_url: str, settings_for: Any, tmp_path: Path
) -> StreamsApi:
    """A data plane whose own service account may create TokenReviews (system:auth-delegator)."""
    kube.kubectl("create", "serviceaccount", "-n", namespace, "dataplane")
    kube.kubectl(
        "create",
        "clusterrolebinding",
        f"{namespace}-dataplane-auth",
        "--clusterrole=system:auth-delegator",
        f"--serviceaccount={namespace}:dataplane",
    )
    own = tmp_path / "dataplane.token"
    own.write_text(kube.kubectl("create", "token", "-n", namespace, "dataplane").stdout)
    auth = KubeAuthSettings(
        api_url=kube.server, ca_file=str(kube.dir / "ca.crt"), token_file=str(own), audiences=(AUDIENCE,)
    )
    for name in ("writer", "reader", "stranger"):
        kube.kubectl("create", "serviceaccount", "-n", namespace, name)
    api = StreamsApi(await aiohttp_client(create_app(settings_for(database_url, kube_auth=auth))))
    await api.create(
        "r",
        "s",
        authorization={
            "append": ["alice", f"system:serviceaccount:{namespace}:writer"],
            "read": [f"group:system:serviceaccounts:{namespace}"],
        },
    )
    return api


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


async def test_allowed_and_forbidden_service_accounts(sa_api: StreamsApi, kube: ControlPlane, namespace: str) -> None:
    writer = sa_api.as_(bearer(token(kube, namespace, "writer")))
    assert (await writer.append("r", "s", {"from": "writer"})).status == 201
    reader = sa_api.as_(bearer(token(kube, namespace, "reader")))
    assert (await reader.read("r", "s")).status == 200, "allowed through its namespace group"
    await problem(await reader.append("r", "s", 1), 403, "forbidden")
    stranger = sa_api.as_(bearer(token(kube, namespace, "stranger")))
    await problem(await stranger.append("r", "s", 1), 403, "forbidden")


async def test_wrong_audience_is_unauthenticated(sa_api: StreamsApi, kube: ControlPlane, namespace: str) -> None:
    other = sa_api.as_(
        bearer(token(kube, namespace, "writer", audience="https://kubernetes.default.svc.cluster.local"))
    )
    await problem(await other.append("r", "s", 1), 401, "unauthenticated")


async def test_expired_and_forged_tokens(sa_api: StreamsApi, kube: ControlPlane, namespace: str) -> None:
    uid = kube.kubectl("get", "serviceaccount", "-n", namespace, "writer", "-o", "jsonpath={.metadata.uid}").stdout
    signing_key = (kube.dir / "sa.key").read_bytes()
    valid = sign_service_account_token(signing_key, namespace, "writer", uid, AUDIENCE, expires_in=600)
    assert (await sa_api.as_(bearer(valid)).append("r", "s", "hand-made but genuine")).status == 201
    expired = sign_service_account_token(signing_key, namespace, "writer", uid, AUDIENCE, expires_in=-60)
    await problem(await sa_api.as_(bearer(expired)).append("r", "s", 1), 401, "unauthenticated")
    forged = sign_service_account_token(_pem_key(_key()), namespace, "writer", uid, AUDIENCE, expires_in=600)
    await problem(await sa_api.as_(bearer(forged)).append("r", "s", 1), 401, "unauthenticated")
    records = await sa_api.as_(bearer(token(kube, namespace, "reader"))).read_all("r", "s")
    assert [r["data"] for r in records] == ["hand-made but genuine"]
