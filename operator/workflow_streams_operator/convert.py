"""From the WorkflowStream spec (Kubernetes camelCase) to the data plane's pins (snake_case).

The result goes through the same ``parse_pins`` as an HTTP create: one validation for both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def snake(name: str) -> str:
    return _CAMEL.sub("_", name).lower()


def pins_from_spec(pins: Mapping[str, Any]) -> dict[str, Any]:
    """Keys are renamed recursively; values (regions, subjects, content classes) are kept as written."""
    return {
        snake(key): pins_from_spec(value) if isinstance(value, Mapping) else _list(value) for key, value in pins.items()
    }


def _list(value: Any) -> Any:
    return [pins_from_spec(v) if isinstance(v, Mapping) else v for v in value] if isinstance(value, list) else value
