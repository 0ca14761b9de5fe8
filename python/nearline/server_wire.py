"""The wire format of ``nearline serve``: how arrays, options and errors travel as JSON.

Shared by the server (:mod:`nearline.server`) and the client (:mod:`nearline.client`), so
both sides read and write one format. An array is either a JSON list (nested for a matrix)
or an object ``{"dtype": "float32", "shape": [n, d], "b64": "..."}`` holding the
little-endian bytes in base64 (exact and about ten times faster to parse than lists of
numbers). JSON has no NaN or infinity: a request holding them is refused; a result slot
with no neighbour (``k`` larger than the index) is ``null`` in a list and ``inf`` in a
base64 array.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

#: dtypes an array may travel as (little-endian on the wire).
WIRE_DTYPES = {"float32": np.dtype("<f4"), "int64": np.dtype("<i8")}


class WireError(ValueError):
    """A request the server refuses: ``status`` is the HTTP status (4xx or 5xx)."""

    def __init__(self, status: int, message: str, kind: str = "ValueError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number: NaN and infinity are refused")


def loads(body: bytes) -> Dict[str, Any]:
    """A request body as a JSON object (NaN/Infinity refused, the top level must be an object)."""
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as e:
        raise WireError(400, f"the body is not UTF-8: {e}") from None
    except RecursionError:
        raise WireError(400, "the body nests too deeply") from None
    except ValueError as e:
        raise WireError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise WireError(400, f"the body must be a JSON object, not {type(value).__name__}")
    return value


def dumps(value: Any) -> bytes:
    """JSON for a response (never NaN or infinity: callers turn those into null)."""
    return json.dumps(value, allow_nan=False, separators=(",", ":")).encode("utf-8")


def encode_array(a: np.ndarray, b64: bool) -> Any:
    """An array for a response: base64 (exact, with inf kept) or lists (non-finite → null)."""
    a = np.asarray(a)
    if b64:
        name = "float32" if a.dtype.kind == "f" else "int64"
        data = np.ascontiguousarray(a, dtype=WIRE_DTYPES[name])
        return {"dtype": name, "shape": list(data.shape), "b64": base64.b64encode(data.tobytes()).decode("ascii")}
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        obj = a.astype(object)
        obj[~np.isfinite(a)] = None
        return obj.tolist()
    return a.tolist()


def decode_array(value: Any, name: str, dtype: str, *, ndim: Tuple[int, ...], max_items: int,
                 missing: Optional[float] = None) -> np.ndarray:
    """An array from a request or a response: a (nested) list or a base64 object, checked for
    dtype, dimensionality and size. ``missing`` replaces ``null`` (responses only)."""
    if isinstance(value, dict):
        keys = set(value)
        if keys != {"dtype", "shape", "b64"}:
            raise WireError(400, f"{name}: a base64 array has exactly the keys dtype, shape and b64, got {sorted(keys)}")
        if value["dtype"] not in WIRE_DTYPES or WIRE_DTYPES[value["dtype"]] != WIRE_DTYPES[dtype]:
            raise WireError(400, f"{name}: dtype must be {dtype!r}, got {value['dtype']!r}")
        shape = value["shape"]
        if (not isinstance(shape, list) or not shape or len(shape) > 2
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
            raise WireError(400, f"{name}: shape must be a list of 1 or 2 non-negative integers, got {shape!r}")
        items = math.prod(shape)
        if items > max_items:
            raise WireError(413, f"{name}: {items} values exceed this server's limit of {max_items}")
        if not isinstance(value["b64"], str):
            raise WireError(400, f"{name}: b64 must be a string")
        try:
            raw = base64.b64decode(value["b64"], validate=True)
        except (binascii.Error, ValueError) as e:
            raise WireError(400, f"{name}: b64 is not valid base64: {e}") from None
        want = items * WIRE_DTYPES[dtype].itemsize
        if len(raw) != want:
            raise WireError(400, f"{name}: shape {shape} needs {want} bytes of {dtype}, b64 holds {len(raw)}")
        arr = np.frombuffer(raw, dtype=WIRE_DTYPES[dtype]).reshape(shape)
    elif isinstance(value, list):
        arr = _from_lists(value, name, dtype, max_items, missing)
    else:
        raise WireError(400, f"{name} must be a list or a base64 array object, not {type(value).__name__}")
    if arr.ndim not in ndim:
        raise WireError(400, f"{name} must have {' or '.join(map(str, ndim))} dimension(s), got shape {list(arr.shape)}")
    if arr.dtype.kind == "f" and missing is None and arr.size and not np.isfinite(arr).all():
        raise WireError(400, f"{name} holds a value that is not finite in {dtype}")
    return arr


def _from_lists(value: List[Any], name: str, dtype: str, max_items: int, missing: Optional[float]) -> np.ndarray:
    rows = value if value and isinstance(value[0], list) else [value]
    total = sum(len(r) if isinstance(r, list) else 1 for r in rows)
    if total > max_items:
        raise WireError(413, f"{name}: {total} values exceed this server's limit of {max_items}")
    for row in rows:
        if not isinstance(row, list):
            raise WireError(400, f"{name} mixes lists and numbers")
        for x in row:
            if x is None and missing is not None:
                continue
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise WireError(400, f"{name} must hold only numbers, found {type(x).__name__}")
            if dtype == "int64" and not isinstance(x, int):
                raise WireError(400, f"{name} must hold integers, found {x!r}")
    if missing is not None:
        value = _fill_missing(value, missing)
    try:
        with np.errstate(over="ignore"):
            arr = np.array(value, dtype=WIRE_DTYPES[dtype])
    except OverflowError:
        raise WireError(400, f"{name} holds a value out of range for {dtype}") from None
    except ValueError as e:
        raise WireError(400, f"{name} is not a rectangular array: {e}") from None
    if arr.dtype == object:
        raise WireError(400, f"{name} is not a rectangular array")
    return arr


def _fill_missing(value: List[Any], missing: float) -> List[Any]:
    return [_fill_missing(x, missing) if isinstance(x, list) else (missing if x is None else x) for x in value]


def option_schema(o: Dict[str, Any], vocabulary: Dict[str, Any]) -> Dict[str, Any]:
    """The JSON schema of one engine option (an entry of ``nearline.SCHEMA["options"]``)."""
    t = o["type"]
    out: Dict[str, Any]
    if t == "int":
        out = {"type": "integer"}
        if "choices_from" in o:
            out["enum"] = vocabulary[o["choices_from"]]
        else:
            out["minimum"] = o["min"]
    elif t == "float":
        out = {"type": "number", ("exclusiveMinimum" if o["min_open"] else "minimum"): o["min"]}
        if o["max"] is not None:
            out["exclusiveMaximum" if o["max_open"] else "maximum"] = o["max"]
    elif t == "bool":
        out = {"type": "boolean"}
    elif t == "name":
        out = {"type": "string", "enum": o.get("choices") or vocabulary[o["choices_from"]]}
    elif t == "budget":
        out = {"type": ["integer", "number", "string"]}
    elif t == "size":
        out = {"type": ["integer", "string"]}
    elif t == "int_or_auto":
        out = {"type": ["integer", "string"], "minimum": o["min"], "maximum": o["max"]}
    else:
        out = {"type": "array", "items": {"type": "integer"}}
    out["description"] = f"{o['doc']}. Default: {o['default']}."
    return out
