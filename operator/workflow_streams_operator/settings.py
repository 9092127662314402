"""The operator's settings, read from the environment once at start-up (``memo.settings``).

The data plane's own parsing (``workflow_streams.adapters.config.Settings``) reads what both share — the
database, the metadata region, the S3 regions and the region CIDRs — so the operator and the data plane
cannot read the same ``WFS_*`` variable two ways; only the operator's own variables are parsed here.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass

from workflow_streams.adapters.config import Settings


@dataclass(frozen=True)
class OperatorSettings:
    shared: Settings
    # all namespaces when None
    namespace: str | None
    peering_name: str
    peering_priority: int
    peering_lifetime: int
    # 0: no metrics server
    metrics_port: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> OperatorSettings:
        return cls(
            shared=Settings.from_env(env),
            namespace=env.get("WFS_OPERATOR_NAMESPACE") or None,
            peering_name=env.get("WFS_OPERATOR_PEERING", "workflow-streams"),
            peering_priority=priority(env.get("WFS_OPERATOR_PRIORITY")),
            peering_lifetime=int(env.get("WFS_OPERATOR_PEERING_LIFETIME", "30")),
            metrics_port=int(env.get("WFS_OPERATOR_METRICS_PORT", "8081")),
        )


def priority(text: str | None) -> int:
    """A peering priority: an integer as given, or derived from any other text (the chart passes the
    pod's UID, so replicas differ and each keeps its priority across restarts of its process)."""
    if text is None or not text.strip():
        return random.randint(1, 1_000_000)
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") % 1_000_000 + 1
