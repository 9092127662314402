"""Content types: the one rule for what a media type is and which ones are JSON.

Records (``data`` vs ``data_base64``, how reads encode a payload), log redaction and the Durable Streams
surface all ask here, so a content type is JSON (or not) the same way everywhere.
"""

from __future__ import annotations


def media_type(content_type: str) -> str:
    """What content types are compared by: the media type, case-insensitively, without parameters."""
    return content_type.split(";", 1)[0].strip().lower()


def is_json(content_type: str) -> bool:
    """``application/json`` and structured-syntax ``+json`` types (RFC 6839), parameters and case aside."""
    base = media_type(content_type)
    return base == "application/json" or base.endswith("+json")
