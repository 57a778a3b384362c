"""Hashes a fingerprint is made of: the code files a stage runs, and the digest of what a stage
wrote (recorded in its ``meta.json``, read by the stages after it). Used by the DAG's
fingerprints and by the stage runtime; no decision about reruns is made here."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

_FILE_HASHES: dict[tuple[str, int, int], str] = {}


def hash_file(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _FILE_HASHES:
        _FILE_HASHES[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _FILE_HASHES[key]


def output_digest(committed: list[str], out_dir: Path) -> str:
    """Hash of everything a stage wrote: its output folder but meta.json, and its
    ``committed`` result files (metrics, plots)."""
    files = sorted(f for f in Path(out_dir).rglob("*") if f.is_file() and f.name != "meta.json")
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(out_dir)).encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    for extra in committed:
        h.update(extra.encode())
        h.update(Path(extra).read_bytes() if Path(extra).exists() else b"")
    return h.hexdigest()


def recorded(out: str, key: str) -> str | None:
    """A value recorded in the meta.json of the stage whose output folder is ``out`` by its
    last run (None when it has not run)."""
    try:
        return json.loads((Path(out) / "meta.json").read_text()).get(key)
    except (OSError, ValueError):
        return None
