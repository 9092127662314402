"""Residency-pinned bucket policies: one statement per stream on each bucket of its object regions.

The statement denies reading the stream's objects from any network outside its pinned client-egress
regions (``aws:SourceIp`` against each region's CIDRs). A region without known CIDRs contributes none,
so a stream whose egress regions have none denies object reads to every network.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from workflow_streams.domain.objects import object_key


def statement_id(run_id: str, stream_id: str) -> str:
    """S3 statement ids are alphanumeric; a digest keeps them unique and short."""
    return "wfs" + hashlib.sha256(f"{run_id}/{stream_id}".encode()).hexdigest()[:24]


def stream_statement(
    bucket: str, run_id: str, stream_id: str, egress_regions: list[str], region_cidrs: Mapping[str, list[str]]
) -> dict[str, Any]:
    prefix = object_key(run_id, stream_id, "*")
    cidrs = sorted({cidr for region in egress_regions for cidr in region_cidrs.get(region, [])})
    statement: dict[str, Any] = {
        "Sid": statement_id(run_id, stream_id),
        "Effect": "Deny",
        "Principal": {"AWS": ["*"]},
        "Action": ["s3:GetObject"],
        "Resource": [f"arn:aws:s3:::{bucket}/{prefix}"],
    }
    if cidrs:
        statement["Condition"] = {"NotIpAddress": {"aws:SourceIp": cidrs}}
    return statement


def with_statement(policy: dict[str, Any], statement: dict[str, Any]) -> dict[str, Any]:
    others = [s for s in policy.get("Statement", []) if s.get("Sid") != statement["Sid"]]
    return {"Version": "2012-10-17", "Statement": [*others, statement]}


def without_statement(policy: dict[str, Any], sid: str) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": [s for s in policy.get("Statement", []) if s.get("Sid") != sid]}
