"""Request bodies as strict JSON (RFC 8259), so whatever is stored can be served to every reader.

Python's ``json`` accepts more than JSON: ``NaN``/``Infinity`` literals, numbers that overflow to
infinity (``1e400``) and escaped lone UTF-16 surrogates (``"\\ud800"``, which no UTF-8 encoder can
write). Stored as payloads they would break every later read, so each is refused, and so is nesting
deeper than ``MAX_DEPTH`` (the parser itself would otherwise hit the recursion limit).

The append path is hot, so the body is parsed once by the C decoder; the checks after it walk only
containers (depth and floats) and look at strings only when the text holds a surrogate escape.
"""

from __future__ import annotations

import json
import re
from math import isfinite
from typing import Any

from .errors import InvalidJson

MAX_DEPTH = 64
"""Arrays and objects nest at most this deep, counting the body itself as level 1."""

# Every surrogate code point in a parsed value comes from such an escape: strict UTF-8 decoding of
# the raw bytes never yields one. A hit only means "look closer" (a valid pair matches too).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


_NEEDS_A_LOOK = frozenset({dict, list, float})
_FLOATS = {float}


class _NonFinite(Exception):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def loads(text: str) -> Any:
    """The value of ``text``, or ``InvalidJson`` naming the rule it breaks."""
    try:
        value = _DECODER.decode(text)
    except _NonFinite as exc:
        raise _invalid("non_finite_number", f"{exc} is not a JSON number") from None
    except json.JSONDecodeError as exc:
        raise _invalid("syntax", f"malformed JSON: {exc.msg} at position {exc.pos}") from None
    except RecursionError:
        raise _too_deep() from None
    except ValueError:  # an integer longer than int() converts (sys.get_int_max_str_digits)
        raise _invalid("number_too_long", "an integer has too many digits") from None
    kind = type(value)
    if kind is dict or kind is list:
        _check_containers(value)
    elif kind is float and not isfinite(value):
        raise _overflow()
    # a one-character search runs at memchr speed; most bodies have no escape at all
    if "\\" in text and _SURROGATE_ESCAPE.search(text) is not None:
        _check_strings(value)
    return value


def _check_containers(value: dict[str, Any] | list[Any]) -> None:
    """Depth, and numbers that overflowed to infinity, one level at a time (no recursion)."""
    level: list[Any] = [value]
    depth = 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            raise _too_deep()
        below = []
        for container in level:
            items = container.values() if type(container) is dict else container
            if len(items) > 16:  # long arrays are mostly scalars: let C look at them first
                kinds = set(map(type, items))
                if kinds.isdisjoint(_NEEDS_A_LOOK):
                    continue
                if kinds == _FLOATS:
                    if not all(map(isfinite, items)):
                        raise _overflow()
                    continue
            for item in items:
                kind = type(item)
                if kind is dict or kind is list:
                    below.append(item)
                elif kind is float and not isfinite(item):
                    raise _overflow()
        level = below


def _check_strings(value: Any) -> None:
    """Encoding to UTF-8 fails exactly on lone surrogates, in keys and values alike."""
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise _invalid("lone_surrogate", "a string holds a lone UTF-16 surrogate, which is not Unicode text") from None


def _overflow() -> InvalidJson:
    return _invalid("non_finite_number", "a number overflows to infinity (beyond ±1.8e308)")


def _too_deep() -> InvalidJson:
    return _invalid("too_deep", f"arrays and objects nest more than {MAX_DEPTH} levels", limit=MAX_DEPTH)


def _invalid(rule: str, detail: str, **extra: Any) -> InvalidJson:
    return InvalidJson(detail, field="/", rule=rule, **extra)
