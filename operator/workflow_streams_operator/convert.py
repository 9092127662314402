"""Between the WorkflowStream spec (Kubernetes camelCase) and the data plane's pins (snake_case).

Names come from the pins model itself, like the CRD schema (``crdgen``): a pin added to the model is
known here and in the CRD without further edits. The result of ``pins_from_spec`` goes through the
same ``parse_pins`` as an HTTP create: one validation for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from workflow_streams.domain.pins import StreamPins, nested_model


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def pins_from_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """camelCase pins as snake_case; names the model does not know are kept, so validation names them."""
    return _rename(StreamPins, spec, to_snake=True)


def spec_from_pins(pins: Mapping[str, Any]) -> dict[str, Any]:
    """snake_case pins (as sent over HTTP or stored) as a WorkflowStream's camelCase ``spec.pins``."""
    return _rename(StreamPins, pins, to_snake=False)


def _rename(model: type[BaseModel], data: Mapping[str, Any], *, to_snake: bool) -> dict[str, Any]:
    # the name as written -> the model's field name
    fields = {camel(name) if to_snake else name: name for name in model.model_fields}
    renamed: dict[str, Any] = {}
    for key, value in data.items():
        name = fields.get(key)
        if name is None:
            renamed[key] = value
            continue
        nested = nested_model(model.model_fields[name].annotation)
        renamed[name if to_snake else camel(name)] = _value(nested, value, to_snake) if nested else value
    return renamed


def _value(model: type[BaseModel], value: Any, to_snake: bool) -> Any:
    if isinstance(value, Mapping):
        return _rename(model, value, to_snake=to_snake)
    if isinstance(value, list):
        return [_value(model, item, to_snake) for item in value]
    return value
