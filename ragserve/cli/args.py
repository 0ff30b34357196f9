"""Argument types shared by ``ragserve`` and ``ragserve eval``: a number a user typed is checked
where it is parsed, so a mistake is a usage error (exit status 2) that names the option."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum``."""

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return whole


def positive_seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds (a timeout)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value
