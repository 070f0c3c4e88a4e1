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

__all__ = [
    "positive_int", "non_negative_int", "bounded_int", "positive_float", "non_negative_float", "seconds", "MAX_DURATION_S",
    "existing_directory", "output_directory", "output_file", "slice_size",
]


def _whole(text: str, least: int, most: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
    if most is not None and value > most:
        raise argparse.ArgumentTypeError(f"must be <= {most:,}, got {value:,}")
    return value


def bounded_int(least: int, most: int):
    """argparse type: a whole number from ``least`` to ``most`` (a count past any machine's memory is a typo,
    and would overflow the C integers it is handed to).

    >>> bounded_int(1, 10)("10"), bounded_int(1, 10).__name__
    (10, 'whole number from 1 to 10')
    >>> bounded_int(1, 10)("11")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be <= 10, got 11
    """
    def parse(text: str) -> int:
        return _whole(text, least, most)

    parse.__name__ = f"whole number from {least:,} to {most:,}"  # argparse names the type in some errors
    return parse


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    return _whole(text, 1)


def slice_size(text: str) -> int:
    """argparse type: flows a time slice holds, 10,000 at least (a slice holds ten steps or more; fewer flows is a mistake)."""
    return _whole(text, 10_000)


def non_negative_int(text: str) -> int:
    """argparse type: a whole number >= 0."""
    return _whole(text, 0)


def output_directory(text: str) -> str:
    """argparse type: a directory to write into, made if missing: not empty text, not a file, under a writable directory.

    Checked before any work, so a typo costs no generated cluster or replay.

    >>> output_directory("")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a directory, got ''
    """
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a directory, got {text!r}")
    if os.path.exists(text):
        if not os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text!r} is a file, not a directory")
        if not os.access(text, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"{text!r} is not writable")
        return text
    # the nearest existing ancestor is where the missing directories are made: it must be a writable directory
    _check_writable_ancestor(text, "made")
    return text


def output_file(text: str) -> str:
    """argparse type: a file to write (made or replaced; missing directories made): not empty text, not a directory, under a writable directory.

    >>> output_file("/")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '/' is a directory, not a file
    """
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a file name, got {text!r}")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a file")
    if os.path.exists(text) and not os.access(text, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r} is not writable")
    # missing directories are made: the nearest existing ancestor must be a writable directory
    _check_writable_ancestor(text, "written")
    return text


def _check_writable_ancestor(text: str, verb: str) -> None:
    """Raise unless the nearest existing ancestor of ``text`` is a writable directory ("``text`` cannot be ``verb``: ...")."""
    parent = os.path.dirname(os.path.abspath(text))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"{text!r} cannot be {verb}: {parent!r} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r} cannot be {verb}: {parent!r} is not writable")


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


#: the longest duration any flag takes, in seconds (7 days): a window, a capture or a comparison
#: longer than that is a typo, and in nanoseconds past int64 it would overflow
MAX_DURATION_S = 7 * 86_400.0


def seconds(text: str) -> float:
    """argparse type: a duration in seconds, > 0 and at most :data:`MAX_DURATION_S` (a week).

    >>> seconds("1e300")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be <= 604800 (7 days), got 1e300
    """
    value = _finite(text, 0.0, strict=True)
    if value > MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_DURATION_S:g} (7 days), got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    return _finite(text, 0.0, strict=True)


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    return _finite(text, 0.0, strict=False)
