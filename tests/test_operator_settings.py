"""The operator's settings: read once at start-up, shared variables by the data plane's own parsing."""

from __future__ import annotations

import json

import pytest

from workflow_streams.adapters.config import Settings
from workflow_streams_operator.settings import OperatorSettings, priority

pytestmark = pytest.mark.unit

ENV = {
    "WFS_DATABASE_URL": "postgresql://db/wfs",
    "WFS_METADATA_REGION": "eu-west-1",
    "WFS_REGION_CIDRS": json.dumps({"eu-west-1": ["10.20.0.0/16"]}),
    "WFS_S3_REGIONS": json.dumps(
        {"eu-west-1": {"endpoint_url": "http://s3", "bucket": "b", "access_key_id": "k", "secret_access_key": "s"}}
    ),
    "WFS_OPERATOR_NAMESPACE": "team-a",
    "WFS_OPERATOR_PEERING_LIFETIME": "10",
    "WFS_OPERATOR_METRICS_PORT": "0",
    # what the chart passes: the pod's UID
    "WFS_OPERATOR_PRIORITY": "0b6f2c1e-7d4a-4f5e-9a51-3c2d1e0f9a8b",
}


def test_shared_settings_are_the_data_planes() -> None:
    settings = OperatorSettings.from_env(ENV)
    data_plane = Settings.from_env(ENV)
    assert settings.shared.metadata_region == data_plane.metadata_region == "eu-west-1"
    assert settings.shared.region_cidrs == data_plane.region_cidrs
    assert settings.shared.s3_regions == data_plane.s3_regions
    assert (settings.namespace, settings.peering_lifetime, settings.metrics_port) == ("team-a", 10, 0)


def test_an_unset_metadata_region_is_none_as_in_the_data_plane() -> None:
    env = {**ENV, "WFS_METADATA_REGION": ""}
    assert OperatorSettings.from_env(env).shared.metadata_region is None
    assert OperatorSettings.from_env({**env, "WFS_OPERATOR_NAMESPACE": ""}).namespace is None


def test_a_pod_uid_is_a_stable_priority() -> None:
    uid = ENV["WFS_OPERATOR_PRIORITY"]
    assert priority(uid) == priority(uid) and 1 <= priority(uid) <= 1_000_000
    assert priority(uid) != priority("1d4c3b2a-0000-4000-8000-000000000000")
    assert priority("200") == 200
