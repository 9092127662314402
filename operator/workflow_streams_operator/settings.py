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

from workflow_streams.adapters.config import Settings, SettingsError, integer_setting


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
    # streams made over HTTP may be adopted by a WorkflowStream annotated workflowstreams.dev/adopt: "true"
    adopt: bool = False
    # a namespace's run ids start with this ({namespace} stands for it); "": any run id, first come
    run_prefix: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> OperatorSettings:
        return cls(
            shared=Settings.from_env(env),
            namespace=env.get("WFS_OPERATOR_NAMESPACE") or None,
            peering_name=env.get("WFS_OPERATOR_PEERING", "workflow-streams"),
            peering_priority=priority(env.get("WFS_OPERATOR_PRIORITY")),
            peering_lifetime=integer_setting(env, "WFS_OPERATOR_PEERING_LIFETIME", 30),
            metrics_port=integer_setting(env, "WFS_OPERATOR_METRICS_PORT", 8081),
            adopt=_boolean(env, "WFS_OPERATOR_ADOPT"),
            run_prefix=env.get("WFS_OPERATOR_RUN_PREFIX", ""),
        )


def _boolean(env: Mapping[str, str], name: str) -> bool:
    text = env.get(name, "").strip().lower()
    if text in ("", "0", "false", "no"):
        return False
    if text in ("1", "true", "yes"):
        return True
    raise SettingsError(name, f"{name} must be true or false, not {text!r}")


def priority(text: str | None) -> int:
    """A peering priority: an integer as given, or derived from any other text (the chart passes the
    pod's UID, so replicas differ and each keeps its priority across restarts of its process)."""
    if text is None or not text.strip():
        return random.randint(1, 1_000_000)
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") % 1_000_000 + 1
