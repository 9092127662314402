"""The payload log: records whose payload may be logged go through here, and a filter redacts them
per the stream's pins unless this process runs in the stream's pinned log region."""

from __future__ import annotations

import logging

from ..domain.pins import StreamPins
from ..domain.redaction import loggable_payload

PAYLOAD_LOG = logging.getLogger("workflow_streams.payload")


def log_payload(message: str, pins: StreamPins, payload: bytes | None, content_type: str) -> None:
    if PAYLOAD_LOG.isEnabledFor(logging.DEBUG):
        PAYLOAD_LOG.debug(message, extra={"wfs_pins": pins, "wfs_payload": payload, "wfs_content_type": content_type})


class RedactingFilter(logging.Filter):
    def __init__(self, here: str) -> None:
        super().__init__()
        self.here = here

    def filter(self, record: logging.LogRecord) -> bool:
        fields = vars(record)
        pins = fields.get("wfs_pins")
        if pins is not None:
            shown = loggable_payload(pins, fields.pop("wfs_payload"), fields["wfs_content_type"], self.here)
            record.msg = f"{record.msg} payload={shown}"  # the raw bytes never reach a handler
        return True


def install(here: str) -> None:
    """Redact for region ``here``: the region this process runs in."""
    for old in [f for f in PAYLOAD_LOG.filters if isinstance(f, RedactingFilter)]:
        PAYLOAD_LOG.removeFilter(old)
    PAYLOAD_LOG.addFilter(RedactingFilter(here))
