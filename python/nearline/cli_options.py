"""Command-line flags of the engine's options, generated from its schema (``nearline.SCHEMA``):
each option's flag, type, choices, placeholder and help (with its default) come from the one
declaration in the engine, and :func:`given` collects what the user gave for a stage."""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable, Iterable, Optional

from .cli_types import _budget, _disk_budget, _nonneg_int, _positive_int, _queries_in_flight


def _schema() -> dict[str, Any]:
    import nearline

    return nearline.SCHEMA


def specs(stage: str) -> list[dict[str, Any]]:
    """The options of ``stage`` (build, open, search, range_search), in declaration order."""
    return [o for o in _schema()["options"] if stage in o["stages"]]


def _float_type(o: dict[str, Any]) -> Callable[[str], float]:
    """A finite number in the option's declared range (a usage error naming the flag otherwise)."""
    lo, hi, lo_open, hi_open = o["min"], o["max"], o["min_open"], o["max_open"]
    if hi is None:
        span = f"{'>' if lo_open else '>='} {lo:g}"
    else:
        span = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        bad = (not math.isfinite(v) or v < lo or (lo_open and v == lo)
               or (hi is not None and (v > hi or (hi_open and v == hi))))
        if bad:
            raise argparse.ArgumentTypeError(f"expected a number {span}, got {text!r}")
        return v

    parse.__name__ = o["name"]
    return parse


def _int_type(o: dict[str, Any]) -> Callable[[str], int]:
    return _positive_int if o.get("min", 0) >= 1 else _nonneg_int


def _argument(o: dict[str, Any]) -> dict[str, Any]:
    """argparse keywords of one option."""
    vocab = _schema()["vocabulary"]
    kw: dict[str, Any] = {"default": None, "dest": o["name"]}
    t = o["type"]
    if t == "bool":
        kw["action"] = argparse.BooleanOptionalAction
    elif t == "int" and "choices_from" in o:
        kw["type"], kw["choices"] = int, vocab[o["choices_from"]]
    elif t == "int":
        kw["type"] = _int_type(o)
    elif t == "float":
        kw["type"] = _float_type(o)
    elif t == "name":
        kw["choices"] = o.get("choices") or vocab[o["choices_from"]]
    elif t == "budget":
        kw["type"] = _budget
    elif t == "size":
        kw["type"] = _disk_budget
        kw["metavar"] = "BYTES"
    elif t == "int_or_auto":
        kw["type"] = _queries_in_flight
    else:
        raise ValueError(f"option {o['name']}: type {t} has no command-line form")
    if o.get("metavar") and t != "bool":
        kw["metavar"] = o["metavar"]
    return kw


def add(p: argparse.ArgumentParser, stage: str, *, exclude: Iterable[str] = (), only: Optional[Iterable[str]] = None,
        prefix: str = "") -> None:
    """Adds the flags of ``stage``'s options to ``p`` (those it does not have yet: an option two
    stages share, such as ``--threads``, is added once and given to both)."""
    skip, keep = set(exclude), None if only is None else set(only)
    for o in specs(stage):
        if o["name"] in skip or (keep is not None and o["name"] not in keep) or o["type"] == "ids":
            continue
        if o["cli"] in p._option_string_actions:
            continue
        p.add_argument(o["cli"], help=f"{prefix}{o['doc']} (default: {o['default']})".replace("%", "%%"),
                       **_argument(o))


def given(args: argparse.Namespace, stage: str, *, exclude: Iterable[str] = ()) -> dict[str, Any]:
    """The options of ``stage`` the command line gave (the rest are left to the engine)."""
    skip = set(exclude)
    out = {}
    for o in specs(stage):
        v = getattr(args, o["name"], None)
        if v is not None and o["name"] not in skip:
            out[o["name"]] = v
    return out


def default(stage: str, name: str) -> Any:
    """The engine's default of an option as a value (a number when the schema states one, else its words)."""
    for o in specs(stage):
        if o["name"] == name:
            text = o["default"]
            try:
                return int(text)
            except ValueError:
                try:
                    return float(text)
                except ValueError:
                    return text
    raise KeyError(f"{stage} has no option {name}")
