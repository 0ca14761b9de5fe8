"""Argument types of the ``nearline`` command line: each parses one option's text or raises
``argparse.ArgumentTypeError`` with what it expected."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _nonneg_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} must be >= 0")
    return v


def _fraction(text: str) -> float:
    """argparse type: a finite fraction in (0, 1]."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (0.0 < v <= 1.0):
        raise argparse.ArgumentTypeError(f"{v} must be a fraction in (0, 1]")
    return v


def _queries_in_flight(text: str) -> Any:
    """argparse type: ``auto`` or an integer in 1..64."""
    if text.strip().lower() == "auto":
        return "auto"
    v = _positive_int(text)
    if v > 64:
        raise argparse.ArgumentTypeError(f"expected 'auto' or at most 64, got {v}")
    return v


def _finite_float(text: str) -> float:
    """argparse type: a finite float (range checks are the engine's)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v


def _budget(text: str) -> Any:
    """A budget: bytes (int), a size string ("512MB", "2GiB") or a fraction in (0, 1]."""
    t = text.strip()
    try:
        return int(t)
    except ValueError:
        pass
    try:
        f = float(t)
    except ValueError:
        return t  # a size string; the engine parses and validates it
    if not 0 < f <= 1:
        raise argparse.ArgumentTypeError(f"a fractional budget must be in (0, 1], got {f}")
    return f


def _budget_list(text: str) -> list[Any]:
    """argparse type: one or more budgets, comma-separated."""
    parts = [x for x in text.split(",") if x.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("expected one or more budgets")
    return [_budget(x) for x in parts]


def _disk_budget(text: str) -> Any:
    """A disk budget: bytes (int) or a size string ("2GiB"); never a fraction."""
    try:
        b = _budget(text)
    except argparse.ArgumentTypeError:
        b = 0.0
    if isinstance(b, float):
        raise argparse.ArgumentTypeError(
            f"a disk budget is bytes or a size such as 2GiB, not a fraction ({text.strip()})")
    return b


def _systems(text: str) -> list[str]:
    """argparse type: comma-separated peers (``diskannpy@T``: diskannpy on T threads)."""
    from nearline.peers import PEERS, THREADED_PEERS, split_system

    names = [x.strip() for x in text.split(",") if x.strip()]
    for n in names:
        try:
            base, _ = split_system(n)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if base not in PEERS:
            raise argparse.ArgumentTypeError(f"unknown system(s) {n}: expected some of {', '.join(PEERS)} "
                                             f"(or {', '.join(x + '@THREADS' for x in THREADED_PEERS)})")
    return names


def _thread_counts(text: str) -> list[int]:
    """argparse type: comma-separated positive thread counts, or "" / none for none."""
    if text.strip().lower() in ("", "none"):
        return []
    return _int_list(text)


def _variant(text: str) -> Any:
    """argparse type: ``NAME:key=value[,key=value...]`` (see :func:`nearline.bench.parse_variant`)."""
    from nearline import bench
    from nearline.peers import SYSTEMS

    try:
        return bench.parse_variant(text, reserved=tuple(SYSTEMS) + (bench.CEILING,))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _k0(text: str) -> Any:
    """argparse type: a positive integer, or ``L`` (the sweep's list size)."""
    if text.strip().upper() == "L":
        return "L"
    return _positive_int(text)


def _range_methods(text: str) -> list[str]:
    """argparse type: comma-separated range-search methods (native, doubling)."""
    from nearline.bench import RANGE_METHODS

    vals = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in vals if v not in RANGE_METHODS]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(RANGE_METHODS)}, got {text!r}")
    return vals


def _recalls(text: str) -> list[float]:
    """argparse type: comma-separated recalls in (0, 1]."""
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated recalls, got {text!r}") from None
    if not vals or any(not 0.0 < v <= 1.0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected recalls in (0, 1], got {text!r}")
    return vals


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (np.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (np.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return v


def _depth(text: str) -> int:
    v = _positive_int(text)
    if v > 256:
        raise argparse.ArgumentTypeError(f"expected a queue depth in 1..256, got {v}")
    return v


def _block_size(text: str) -> int:
    v = _positive_int(text)
    if v % 4096:
        raise argparse.ArgumentTypeError(f"expected a multiple of 4096 bytes, got {v}")
    return v
