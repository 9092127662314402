"""Identifiers that appear in URLs and keys: a small safe alphabet, so no path or SQL tricks pass."""

from __future__ import annotations

import re

from .errors import InvalidInput

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_id(kind: str, value: str) -> str:
    """Return ``value`` if it is a valid identifier, else raise InvalidInput naming ``kind``."""
    if not _ID.fullmatch(value) or ".." in value:
        raise InvalidInput(
            f"{kind} must be 1-128 characters of letters, digits, '.', '_' or '-', starting with a letter or digit",
            field=kind,
        )
    return value
