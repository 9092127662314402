"""What a new definition must satisfy beyond its model: someone can use it, and this data plane can serve it.

Pins are immutable, so a stream that nobody may read or append to, or whose data no region here can
serve, would be broken for good the moment it is created. Such pins are refused at create (``422``,
naming the field) by our HTTP API and the operator alike (the Durable Streams surface's pins come from
its own template, which grants ``*`` in this data plane's region by default). The rules apply
to new definitions only: a stream an earlier release stored keeps working as it was (its identical
definition is answered as before, ``store.definitions.create_definition``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from .authz import subjects_of
from .errors import InvalidDefinition
from .pins import StreamPins


@dataclass(frozen=True)
class Served:
    """What this data plane serves: its own region (client egress of callers in no known range), the
    regions whose callers it can tell apart (``WFS_REGION_CIDRS``) and the regions of its object stores
    (none configured: objects are not served here at all, and no pin is judged by them)."""

    region: str
    client_regions: Collection[str] = ()
    object_regions: Collection[str] = ()

    @property
    def egress_regions(self) -> set[str]:
        return {self.region, *self.client_regions}


def refusal(pins: StreamPins, served: Served) -> InvalidDefinition | None:
    """Why these pins must not define a new stream here, or None."""
    errors = []
    for action in ("read", "append"):
        if not subjects_of(pins.authorization, action):
            errors.append(
                {
                    "field": f"authorization/{action}",
                    "message": f"no principal may {action}: the stream would be unusable for good (pins are "
                    "immutable); name at least one subject, e.g. your principal or group:<name>",
                }
            )
    placement = pins.placement
    if not served.egress_regions.intersection(placement.client_egress_regions):
        errors.append(
            {
                "field": "placement/client_egress_regions",
                "message": f"no region this data plane serves clients in ({', '.join(sorted(served.egress_regions))})"
                " is among them: no client could read the stream",
            }
        )
    if served.object_regions and not set(served.object_regions).intersection(placement.object_regions):
        errors.append(
            {
                "field": "placement/object_regions",
                "message": f"no object store of this data plane ({', '.join(sorted(served.object_regions))}) "
                "is among them: no object could be stored",
            }
        )
    if not errors:
        return None
    fields = ", ".join(e["field"] for e in errors)
    return InvalidDefinition(f"the pins cannot make a usable stream here ({fields})", errors=errors)
