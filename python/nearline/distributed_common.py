"""The files of a collection (:mod:`nearline.distributed`) and the argument checks its calls share:
the manifest (``collection.json``, with its checksum and format version), the k-means centroids
and the automatic-id mark, written atomically and verified when read. No Ray."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any, Dict, Optional, Union

import numpy as np

from nearline import CorruptIndexError, FormatError
from nearline.distributed_routing import HASH, KMEANS

MANIFEST = "collection.json"
CENTROIDS = "centroids.npy"
IDS_FILE = "ids.json"
FORMAT = "nearline-collection"
#: The manifest format this version writes and reads (a newer one is refused).
FORMAT_VERSION = 1
ID_LIMIT = 2**63


# --------------------------------------------------------------------------- argument checks


def check_int(name: str, value: Any, lo: int, hi: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{name}={v} must be " + (f">= {lo}" if hi is None else f"in {lo}..{hi}"))
    return v


def check_timeout(timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.integer, np.floating)):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    t = float(timeout)
    if not (np.isfinite(t) and t > 0):
        raise ValueError(f"timeout={timeout} must be a positive number of seconds")
    return t


def check_options(given: Dict[str, Any], allowed: frozenset, call: str) -> Dict[str, Any]:
    bad = sorted(set(given) - allowed)
    if bad:
        raise TypeError(f"{call}() got unexpected keyword argument(s) {', '.join(bad)}; "
                        f"accepted: {', '.join(sorted(allowed))}")
    return {k: v for k, v in given.items() if v is not None}


def check_ids(ids: Any, n: int, what: str) -> np.ndarray:
    a = np.asarray(ids)
    if a.ndim == 0:
        a = a[None]
    if a.ndim != 1:
        raise ValueError(f"{what} must be a 1-D array, got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{what} must be integers (got dtype {a.dtype}); floats are refused, not truncated")
    if n >= 0 and a.size != n:
        raise ValueError(f"{what} has {a.size} ids for {n} vectors")
    if a.size and np.issubdtype(a.dtype, np.unsignedinteger) and int(a.max()) >= ID_LIMIT:
        raise ValueError(f"{what}: id {int(a.max())} is out of range: ids must be in 0..2**63")
    a = a.astype(np.int64)
    if a.size and int(a.min()) < 0:
        i = int(np.argmin(a))
        raise ValueError(f"{what}[{i}] = {int(a[i])} is negative: ids must be in 0..2**63")
    return a


def duplicates(ids: np.ndarray) -> np.ndarray:
    s = np.sort(ids)
    return np.unique(s[1:][s[1:] == s[:-1]])


# --------------------------------------------------------------------------- files


def canonical(doc: Dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def write_json(path: Path, doc: Dict[str, Any]) -> None:
    """Writes ``doc`` plus its checksum atomically (temporary file, fsync, rename)."""
    body = dict(doc)
    body["checksum"] = "sha256:" + hashlib.sha256(canonical(doc)).hexdigest()
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    with tmp.open("w") as f:
        f.write(json.dumps(body, indent=1, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: Path) -> Dict[str, Any]:
    """A JSON file written by :func:`write_json`, its checksum verified."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as e:
        raise CorruptIndexError(f"{path}: unreadable: {e}") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise CorruptIndexError(f"{path}: truncated or not JSON ({e}): the file is corrupt") from None
    if not isinstance(doc, dict) or "checksum" not in doc:
        raise CorruptIndexError(f"{path}: no checksum: not a file nearline wrote, or truncated")
    want = doc.pop("checksum")
    got = "sha256:" + hashlib.sha256(canonical(doc)).hexdigest()
    if want != got:
        raise CorruptIndexError(f"{path}: checksum mismatch (stored {want}, content {got}): the file is corrupt")
    return doc


def read_manifest(path: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """The verified manifest of the collection at ``path``.

    Raises:
        FileNotFoundError: no collection there. FormatError: not a collection (a single index,
            say) or written by a newer version. CorruptIndexError: truncated, corrupt (checksum)
            or incomplete manifest.
    """
    p = Path(os.fspath(path))
    m = p / MANIFEST
    if not m.is_file():
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such collection directory")
        if (p / "manifest.json").is_file():
            raise FormatError(f"{p} is a single nearline index, not a collection: open it with nearline.open")
        raise FileNotFoundError(f"{p}: not a collection ({MANIFEST} is missing)")
    doc = read_json(m)
    if doc.get("format") != FORMAT:
        raise FormatError(f"{m}: format {doc.get('format')!r} is not {FORMAT!r}")
    version = doc.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise FormatError(f"{m}: format_version {version!r} is unknown: this nearline reads versions 1.."
                          f"{FORMAT_VERSION} (written by a newer version? upgrade nearline)")
    for key in ("dim", "metric", "routing", "segments", "n"):
        if key not in doc:
            raise CorruptIndexError(f"{m}: field {key!r} is missing")
    segs = doc["segments"]
    if not isinstance(segs, list) or not segs or not all(isinstance(s, dict) and "name" in s for s in segs):
        raise CorruptIndexError(f"{m}: 'segments' must be a non-empty list of segment entries")
    for s in segs:
        name = str(s["name"])
        if not name or "/" in name or name.startswith("."):
            raise CorruptIndexError(f"{m}: segment name {name!r} is not a plain subdirectory name")
    if doc["routing"].get("kind") not in (HASH, KMEANS):
        raise FormatError(f"{m}: routing {doc['routing'].get('kind')!r} is unknown: expected hash or kmeans")
    return doc


def load_centroids(p: Path, doc: Dict[str, Any]) -> Optional[np.ndarray]:
    if doc["routing"]["kind"] != KMEANS:
        return None
    f = p / CENTROIDS
    try:
        raw = f.read_bytes()
    except FileNotFoundError:
        raise CorruptIndexError(f"{f}: missing (k-means routing needs its centroids)") from None
    want = doc["routing"].get("centroids_sha256")
    if want != hashlib.sha256(raw).hexdigest():
        raise CorruptIndexError(f"{f}: checksum mismatch with {MANIFEST}: the file is corrupt")
    c = np.load(f)
    if c.shape != (len(doc["segments"]), int(doc["dim"])):
        raise CorruptIndexError(f"{f}: shape {c.shape}, expected ({len(doc['segments'])}, {doc['dim']})")
    return np.ascontiguousarray(c, dtype=np.float32)
