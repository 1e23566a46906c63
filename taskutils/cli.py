"""Argument types shared by the command lines (``quickstart.py``, ``python -m taskutils.memory_data``,
``python -m taskutils.memory_eval.run``): a count given as 0 or a negative number is refused by argparse (exit 2,
naming the option) instead of being replaced by a default or failing later with a traceback."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An integer >= 1 (a count or a size)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (where 0 has a meaning of its own, such as 'no cap')."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
