"""Metadata filters as SQL: ``{key: scalar}``, every key must match by equality.

``json_each`` over the document's metadata object gives each top-level key with its JSON type, so
keys may contain any character and ``true`` never matches ``1`` (nor ``"1"``).
"""

from __future__ import annotations

from typing import Any


def filter_sql(metadata_filter: dict[str, Any] | None, column: str = "metadata") -> tuple[str, list[Any]]:
    """(SQL condition, parameters); ``("1", [])`` for no filter."""
    if not metadata_filter:
        return "1", []
    clauses: list[str] = []
    params: list[Any] = []
    for key, value in metadata_filter.items():
        if isinstance(value, bool):
            cond = "j.type = ?"
            args: list[Any] = ["true" if value else "false"]
        elif value is None:
            cond, args = "j.type = 'null'", []
        elif isinstance(value, int | float):
            cond, args = "j.type IN ('integer', 'real') AND j.value = ?", [value]
        elif isinstance(value, str):
            cond, args = "j.type = 'text' AND j.value = ?", [value]
        else:
            raise ValueError(f"metadata_filter[{key!r}] must be a string, number, boolean or null")
        clauses.append(f"EXISTS (SELECT 1 FROM json_each({column}) AS j WHERE j.key = ? AND {cond})")
        params += [key, *args]
    return " AND ".join(clauses), params
