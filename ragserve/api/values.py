"""What the API accepts inside free-form fields (docs/architecture.md §8).

Metadata and metadata filters are stored as JSON in SQLite and compared there, text goes to
tokenizers, SQLite and upstream servers as UTF-8. Values that JSON parsing lets through but none of
those can hold are refused here, with a message naming the field, instead of failing later as a
500 or, worse, being stored and breaking every later read:

* numbers must be finite (``NaN``/``Infinity`` are not JSON and break filtered lists and responses);
* integers must fit 64 bits (SQLite's integer);
* strings must be valid Unicode text: no lone surrogates (``"\\ud800"``), which UTF-8 cannot encode,
  anywhere in a request: every request model is a :class:`RequestModel`, which checks every string
  and number of every field (list items, object keys and values, extra fields) and names the field;
* metadata is flat: a value is a scalar (string, number, boolean, null) or a list of scalars, with
  bounded key count, key length, list length and string length; a filter is ``{key: scalar}``;
* JSON, in a body or a query string, nests at most ``MAX_JSON_DEPTH`` arrays and objects: checked
  by a linear scan before it is parsed, since parsing, validating and forwarding it all recurse.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ValidationInfo, field_validator, model_validator

MAX_METADATA_KEYS = 128
MAX_KEY_CHARS = 256
MAX_LIST_ITEMS = 1024
MAX_VALUE_CHARS = 65_536
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Arrays and objects inside one another in a request's JSON (a tool's JSON schema rarely needs 20).
MAX_JSON_DEPTH = 64

_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(value: str, where: str) -> str:
    """``value`` if it is valid Unicode text (no lone surrogates), else ``ValueError`` naming ``where``."""
    if value.isascii():  # read from the string's header: no scan
        return value
    match = _SURROGATE.search(value)
    if match is not None:
        raise ValueError(
            f"{where} contains a lone surrogate (\\u{ord(match.group()):04x}) at character "
            f"{match.start()}: send valid UTF-8 text"
        )
    return value


def _bad_scalar(x: Any) -> bool:
    """Whether ``x``, a scalar, is a string with a lone surrogate or a number that is not finite."""
    if isinstance(x, str):
        return not x.isascii() and _SURROGATE.search(x) is not None
    return isinstance(x, float) and not math.isfinite(x)


#: Where a value sits in a request, kept as links to its parent and written out only for a value
#: at fault (:func:`place`): the field's name, or ``(parent, list index or object key)``.
_Place = str | tuple[Any, int | str]


def _subscript(step: int | str) -> str:
    return f"[{step!r}]" if isinstance(step, str) else f"[{step}]"


def place(at: _Place, step: Callable[[Any], str] = _subscript) -> str:
    """``at`` written out, each step as ``step`` writes it: ``documents[3]['metadata']``."""
    steps: list[str] = []
    while isinstance(at, tuple):
        at, last = at
        steps.append(step(last))
    return at + "".join(reversed(steps))


def check_values(value: Any, where: str) -> None:
    """Every string in ``value`` valid Unicode (:func:`check_text`) and every number finite: the
    value itself, or the items, keys and values of the lists and objects it holds (a walk without
    recursion; models inside it checked themselves). A value's place (``where[3]['k']``) is written
    out only for the value at fault: a body of a million values costs their checks, not a million
    paths."""
    stack: list[tuple[Any, _Place]] = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                check_text(item, place(at))
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(f"{place(at)}: {item} is not a finite number (NaN and Infinity are not JSON)")
        elif isinstance(item, list | tuple):
            for i, x in enumerate(item):  # scalars in place: a list may hold millions of them
                if x is None or isinstance(x, int):
                    continue
                if isinstance(x, list | tuple | dict) or _bad_scalar(x):
                    stack.append((x, (at, i)))
        elif isinstance(item, dict):
            for key, x in item.items():
                if isinstance(key, str) and not key.isascii():
                    check_text(key, f"{place(at)} key")
                if x is None or isinstance(x, int):
                    continue
                if isinstance(x, list | tuple | dict) or _bad_scalar(x):
                    stack.append((x, (at, key)))


def replace_lone_surrogates(value: Any) -> Any:
    """``value`` (parsed JSON) with every lone surrogate in its strings, keys included, replaced by
    U+FFFD: for text from *elsewhere* (an upstream server's answer), which is not the client's to
    fix but must still be encodable as UTF-8 when it is sent on. A walk without recursion."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    root: list[Any] = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        holder, key = stack.pop()
        item = holder[key]
        if isinstance(item, str):
            holder[key] = _SURROGATE.sub("\ufffd", item)
        elif isinstance(item, list):
            stack.extend((item, i) for i in range(len(item)))
        elif isinstance(item, dict):
            fixed = {(_SURROGATE.sub("\ufffd", k) if isinstance(k, str) else k): v for k, v in item.items()}
            holder[key] = fixed
            stack.extend((fixed, k) for k in fixed)
    return root[0]


class RequestModel(BaseModel):
    """A request body (or a part of one): no string anywhere in it holds a lone surrogate, which
    storage, tokenizers, encoders and upstream servers cannot take, and no number is NaN or
    Infinity, which a field typed ``Any`` (or an extra field) would forward upstream as invalid
    JSON (a 4xx naming the field)."""

    #: Fields whose type's own validator already checks every string and number in them (flat
    #: metadata, ``check_metadata``; a filter, ``check_filter``): not walked a second time.
    values_checked_by_type: ClassVar[frozenset[str]] = frozenset()

    @field_validator("*", mode="after")
    @classmethod
    def _valid_values(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name not in cls.values_checked_by_type:
            check_values(value, info.field_name or "value")
        return value

    @model_validator(mode="after")
    def _valid_extra_values(self) -> RequestModel:
        for key, value in (self.model_extra or {}).items():
            check_text(key, "a field name")
            check_values(value, key)
        return self


def _plain(value: Any) -> bool:
    """Whether ``value`` is a scalar that :func:`_check_scalar` accepts, told without a scan (an
    ASCII string within bounds, a 64-bit integer, a finite float, a boolean or null): the checks
    below then write no message for it."""
    kind = type(value)
    if kind is str:
        return len(value) <= MAX_VALUE_CHARS and value.isascii()
    if kind is int:
        return INT64_MIN <= value <= INT64_MAX
    if kind is float:
        return math.isfinite(value)
    return value is None or kind is bool


def _check_scalar(value: Any, where: str) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"{where}: integer {value} does not fit in 64 bits")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value} is not a finite number (NaN and Infinity are not JSON)")
        return
    if isinstance(value, str):
        if len(value) > MAX_VALUE_CHARS:
            raise ValueError(f"{where}: strings are limited to {MAX_VALUE_CHARS} characters, got {len(value)}")
        check_text(value, where)
        return
    raise ValueError(f"{where} must be a string, number, boolean or null")


def _check_keys(obj: dict[Any, Any], what: str) -> None:
    if len(obj) > MAX_METADATA_KEYS:
        raise ValueError(f"{what} has {len(obj)} keys; at most {MAX_METADATA_KEYS} are accepted")
    for key in obj:
        if type(key) is str and 0 < len(key) <= MAX_KEY_CHARS and key.isascii():
            continue
        if not isinstance(key, str) or not key:
            raise ValueError(f"{what} keys must be non-empty strings")
        if len(key) > MAX_KEY_CHARS:
            raise ValueError(f"{what} keys are limited to {MAX_KEY_CHARS} characters")
        check_text(key, f"{what} key")


def check_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """Flat metadata: each value a scalar or a list of scalars (see the module docstring)."""
    _check_keys(metadata, "metadata")
    for key, value in metadata.items():
        if _plain(value):
            continue
        where = f"metadata[{key!r}]"
        if isinstance(value, list):
            if len(value) > MAX_LIST_ITEMS:
                raise ValueError(f"{where}: lists are limited to {MAX_LIST_ITEMS} items, got {len(value)}")
            for i, item in enumerate(value):
                if _plain(item):
                    continue
                if isinstance(item, list | dict):
                    raise ValueError(
                        f"{where}[{i}]: metadata lists hold strings, numbers, booleans or null, "
                        "not nested lists or objects"
                    )
                _check_scalar(item, f"{where}[{i}]")
        elif isinstance(value, dict):
            raise ValueError(
                f"{where}: metadata values are strings, numbers, booleans, null or lists of "
                "them; nested objects are not accepted (flatten the key, e.g. 'author.name')"
            )
        else:
            _check_scalar(value, where)
    return metadata


def check_filter(flt: Any) -> dict[str, Any] | None:
    """A filter is ``{key: scalar}``, matched by equality; all keys must match."""
    if flt is None:
        return None
    if not isinstance(flt, dict):
        raise ValueError("metadata_filter must be a JSON object of key: value pairs")
    _check_keys(flt, "metadata_filter")
    for key, value in flt.items():
        if _plain(value):
            continue
        if isinstance(value, list | dict):
            raise ValueError(f"metadata_filter[{key!r}] must be a string, number, boolean or null")
        _check_scalar(value, f"metadata_filter[{key!r}]")
    return flt


_DEPTH_BLOCK = 1 << 20


def json_depth(text: str | bytes) -> int:
    """How deep arrays and objects nest in ``text`` (``json_shape``)."""
    return json_shape(text)[0]


def json_shape(text: str | bytes) -> tuple[int, int]:
    """``(depth, values)`` of ``text`` (JSON, valid or not; bytes: UTF-8), found without parsing it,
    in linear time and without recursion: how deep arrays and objects nest, and about how many
    values it holds (every array item and object member: the commas and the openings outside
    strings, plus one). Escaped backslashes and quotes are dropped, so that every quote left opens
    or closes a string; the depth is the highest running count of the openings over the closings
    outside strings (numpy, a block at a time)."""
    raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    data = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    deepest = level = quotes = 0
    values = 1
    for start in range(0, len(data), _DEPTH_BLOCK):
        block = np.frombuffer(data, np.uint8, count=min(_DEPTH_BLOCK, len(data) - start), offset=start)
        is_quote = block == ord('"')
        outside = (np.cumsum(is_quote, dtype=np.int64) + quotes) % 2 == 0  # right for all but quotes
        quotes += int(is_quote.sum())
        opens = outside & ((block == ord("[")) | (block == ord("{")))
        closes = outside & ((block == ord("]")) | (block == ord("}")))
        values += int(opens.sum()) + int((outside & (block == ord(","))).sum())
        levels = np.cumsum(opens.astype(np.int64) - closes.astype(np.int64)) + level
        deepest, level = max(deepest, int(levels.max())), int(levels[-1])
    return deepest, values


def check_json_depth(text: str | bytes, where: str, limit: int = MAX_JSON_DEPTH) -> int:
    """``ValueError`` naming ``where`` when ``text`` nests arrays and objects deeper than ``limit``;
    else about how many values it holds (``json_shape``, the same scan)."""
    depth, values = json_shape(text)
    if depth > limit:
        raise ValueError(f"{where} nests arrays and objects {depth} levels deep; at most {limit} levels are accepted")
    return values


def json_error_message(error: json.JSONDecodeError) -> str:
    """What is wrong with a JSON text and where: ``invalid JSON at line 1, column 15: Expecting ','``."""
    return f"invalid JSON at line {error.lineno}, column {error.colno}: {error.msg}"


def parse_json(text: str, where: str) -> Any:
    """``text`` parsed as JSON once its depth is known to be bounded, else ``ValueError`` naming
    ``where`` and saying what is wrong and where."""
    check_json_depth(text, where)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: {json_error_message(e)}") from e
    except ValueError as e:  # a number Python will not parse (an integer past its digit limit)
        raise ValueError(f"{where}: {number_error_message(text)}") from e


#: An integer literal longer than Python parses (``sys.get_int_max_str_digits()``, 4300 by default):
#: found at the start of a run of digits only, so the search is linear.
_MAX_DIGITS = sys.get_int_max_str_digits() or 4300
_LONG_INTEGER = re.compile("(?<![0-9])[0-9]{" + str(_MAX_DIGITS + 1) + "}")


def number_error_message(text: str) -> str:
    """What is wrong with a JSON text that parses but holds a number Python refuses to convert:
    where it is, and what is accepted (integers fit 64 bits anywhere in a request)."""
    match = _LONG_INTEGER.search(text)
    if match is None:
        return "invalid JSON: a number cannot be read (integers must fit in 64 bits)"
    line = text.count("\n", 0, match.start()) + 1
    column = match.start() - (text.rfind("\n", 0, match.start()) + 1) + 1
    return (
        f"invalid JSON at line {line}, column {column}: an integer of more than {_MAX_DIGITS} digits; "
        f"integers must fit in 64 bits ({INT64_MIN} to {INT64_MAX})"
    )
