"""Placement: where a caller is, and whether a definition's pins allow what this process is asked to do."""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping, Sequence

from .errors import PlacementViolation
from .pins import StreamPins


def client_region(
    remote: str | None,
    forwarded_for: str | None,
    region_cidrs: Mapping[str, Sequence[str]],
    trusted_proxies: Sequence[str],
    default_region: str,
) -> str:
    """The caller's region from its address (``X-Forwarded-For`` only via a trusted proxy).

    An address in no known range is taken to be in this process's own region: in-cluster callers
    reach the data plane of their own region.
    """
    address = _ip(remote)
    if address is not None and forwarded_for and _within(address, trusted_proxies):
        address = _ip(forwarded_for.split(",")[0].strip()) or address
    if address is not None:
        for region, cidrs in region_cidrs.items():
            if _within(address, cidrs):
                return region
    return default_region


def check_egress(pins: StreamPins, region: str) -> None:
    if region not in pins.placement.client_egress_regions:
        raise PlacementViolation(
            f"reads from region {region!r} are outside the stream's client-egress regions",
            client_region=region,
        )


def check_metadata_home(pins: StreamPins, metadata_region: str | None) -> None:
    """Metadata lives only in its pinned home: a data plane writes definitions only for its own."""
    if metadata_region is not None and pins.placement.metadata_home != metadata_region:
        raise PlacementViolation(
            f"this data plane keeps metadata in {metadata_region!r}; the stream's metadata home is "
            f"{pins.placement.metadata_home!r}: create it through that region's data plane",
            metadata_home=pins.placement.metadata_home,
        )


# Every subscribe and read asks where its caller is, and ipaddress parses in Python: parsing the peer's
# address and every configured range afresh would be paid by every request of a burst of subscribers
# (figures: bench/README.md, constants). Callers come from a bounded set of addresses (pods, proxies),
# and the ranges are configuration: both are parsed once.
@functools.lru_cache(maxsize=4096)
def _ip(text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text) if text else None
    except ValueError:
        return None


@functools.lru_cache(maxsize=1024)
def _network(cidr: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(cidr, strict=False)


def _within(address: ipaddress.IPv4Address | ipaddress.IPv6Address, cidrs: Sequence[str]) -> bool:
    return any(address in _network(cidr) for cidr in cidrs)
