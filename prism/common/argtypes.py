"""argparse types shared by the command lines: numbers with their range checked.

>>> positive_int("3"), non_negative_int("0"), positive_float("0.5"), non_negative_float("0")
(3, 0, 0.5, 0.0)
>>> positive_int("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: must be >= 1, got 0
"""
from __future__ import annotations

import argparse
import os

__all__ = ["positive_int", "non_negative_int", "positive_float", "non_negative_float", "existing_directory", "slice_size"]


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    return _whole(text, 1)


def slice_size(text: str) -> int:
    """argparse type: flows a time slice holds, 10,000 at least (a slice holds ten steps or more; fewer flows is a mistake)."""
    return _whole(text, 10_000)


def non_negative_int(text: str) -> int:
    """argparse type: a whole number >= 0."""
    return _whole(text, 0)


def existing_directory(text: str) -> str:
    """argparse type: a directory that exists and can be written to."""
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    if not os.access(text, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r} is not writable")
    return text


def _finite(text: str, least: float, strict: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (least < value if strict else least <= value) or value == float("inf"):  # NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strict else '>='} {least:g}, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    return _finite(text, 0.0, strict=True)


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    return _finite(text, 0.0, strict=False)
