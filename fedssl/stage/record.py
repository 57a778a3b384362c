"""The plan as data: one small JSON record per stage (``pipelines/plan/<stage>.json``),
written by ``python -m fedssl.pipeline write`` (and by the Snakefile as it plans) from the DAG,
and read by the stage runtime (:mod:`fedssl.stage.base`) instead of the DAG.

A record says what the stage runs and reads: its command, the params keys it reads (and the
digest of their values), its inputs (upstream stages and their output folders), its outputs,
its code dependencies, the hooks it calls and the method whose stage it is. A stage's code is
what it runs, not the planner: editing the planner, adding a data set or an evaluation reruns
only the stages whose records change. Both front ends list the record as the stage's
dependency (a DVC dep; for Snakemake its digest is part of the fingerprint).

Here too, as both sides use them: the raw values of the params files a record names (read as
YAML, :class:`ParamsError` naming the file), the hashes a fingerprint is made of (the code
files a stage runs, the digest of what a stage wrote, recorded in its ``meta.json``) and the
fingerprint itself. A ground-floor module: it imports nothing of the project, so a stage that
reads its record runs no planning code.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from functools import cache
from pathlib import Path

import yaml

PLAN_RECORDS = Path("pipelines") / "plan"  # each stage's record, committed

# The precision policy: the stage runtime imports it by name, for a stage that computes on a
# device (its record's ``gpu``), so the planner names it among those stages' code only.
PRECISION = "fedssl.precision"
COMPILED = "fedssl.compiled"  # the compile policy, likewise


class ParamsError(ValueError):
    """A params file that cannot be used; the message names the file and the field."""


def did_you_mean(word: str, names) -> str:
    """`` (did you mean 'a' or 'b'?)``: the names nearest a mistyped ``word`` (up to three),
    or '' when none is near."""
    near = difflib.get_close_matches(word, list(names), n=3, cutoff=0.75)
    if not near:
        return ""
    quoted = [f"'{n}'" for n in near]
    listed = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + f" or {quoted[-1]}"
    return f" (did you mean {listed}?)"


# ---------------------------------------------------------------------------- records
def record_path(stage: str) -> Path:
    return PLAN_RECORDS / f"{stage}.json"


def record_text(record: dict) -> str:
    return json.dumps(record, indent=1, sort_keys=True) + "\n"


def record_digest(record: dict) -> str:
    return hashlib.sha256(record_text(record).encode()).hexdigest()


def values_digest(values: dict) -> str:
    """The digest of the raw params values a stage reads (file -> key -> value)."""
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()


def read_record(stage: str) -> dict | None:
    """The stage's record as written (None when there is none)."""
    try:
        return json.loads(record_path(stage).read_text())
    except (OSError, ValueError):
        return None


def is_current(record: dict) -> bool:
    """Whether the params a record names still hold the values it was planned with."""
    return record["params_digest"] == values_digest(raw_values(record["params"]))


def write_records(records: list[dict], existing_only: bool = False) -> list[Path]:
    """Write each record whose text changed (an unchanged one keeps its file untouched;
    ``existing_only``: create none); returns the files written."""
    written = []
    for record in records:
        path, text = record_path(record["stage"]), record_text(record)
        if existing_only and not path.exists():
            continue
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text)
            tmp.replace(path)  # atomic: a stage starting now reads the old record or the new one
            written.append(path)
    return written


# ---------------------------------------------------------------------------- fingerprints
def fingerprint_inputs(record: dict, params_values: dict) -> dict:
    """What a stage's output depends on, as both front ends see it: its command, the raw
    params values it reads, the hashes of its code, the output digests its upstream stages
    recorded, and its record."""
    return {
        "cmd": record["command"],
        "params": params_values,
        "code": {c: hash_file(Path(c)) for c in record["code"]},
        "upstream": {u: recorded(i["out"], "output_digest") for u, i in record["inputs"].items()},
        "plan": record_digest(record),
    }


def fingerprint(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


_FILE_HASHES: dict[tuple[str, int, int], str] = {}


def hash_file(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _FILE_HASHES:
        _FILE_HASHES[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _FILE_HASHES[key]


def output_digest(
    committed: list[str], out_dir: Path, staged: dict[str, Path] | None = None
) -> str:
    """Hash of everything a stage wrote: its output folder but meta.json, and its
    ``committed`` result files (metrics, plots); ``staged``: where committed files lie that
    have not landed yet (path -> scratch copy)."""
    files = sorted(f for f in Path(out_dir).rglob("*") if f.is_file() and f.name != "meta.json")
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(out_dir)).encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    for extra in committed:
        h.update(extra.encode())
        path = Path((staged or {}).get(extra, extra))
        h.update(path.read_bytes() if path.exists() else b"")
    return h.hexdigest()


def recorded(out: str, key: str) -> str | None:
    """A value recorded in the meta.json of the stage whose output folder is ``out`` by its
    last run (None when it has not run)."""
    try:
        return json.loads((Path(out) / "meta.json").read_text()).get(key)
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------- files written
# Each stage's files as they lay when last found intact (size, mtime, inode and SHA-256), one
# small file per stage: checking an output against the digests in its meta.json hashes only
# the files whose stat changed since (DVC's state database does the same), so planning stays
# cheap however large the models and pixels are. A cache: not part of any output.
FILE_STATS = Path("artifacts/.cache/files")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _stat(path: str) -> list[int] | None:
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def remember_files(stage: str, digests: dict[str, str]) -> None:
    """Note the files ``stage`` just put in place, with their SHA-256 ``digests``."""
    _write_stats(stage, {f: [*s, d] for f, d in digests.items() if (s := _stat(f))})


def changed_files(
    stage: str, out: Path, recorded: dict[str, str], trust_stat: bool = True
) -> list[str]:
    """The files of ``stage`` (its output folder ``out`` and its committed files) that differ
    from the SHA-256 ``recorded`` in its meta.json: changed, missing, or new in the folder. A
    file is hashed only when its size, mtime or inode changed since it was found intact
    (every file, without ``trust_stat``: before a stage reads them)."""
    known, intact, changed = _read_stats(stage), {}, []
    for name, digest in recorded.items():
        stat = _stat(name)
        if trust_stat and stat is not None and known.get(name) == [*stat, digest]:
            intact[name] = known[name]
        elif stat is not None and sha256_file(Path(name)) == digest:
            intact[name] = [*stat, digest]
        else:
            changed.append(name)
    if intact != known:
        _write_stats(stage, intact)
    present = (str(f) for f in sorted(Path(out).rglob("*")) if f.is_file())
    return changed + [f for f in present if f not in recorded and Path(f).name != "meta.json"]


def _read_stats(stage: str) -> dict:
    try:
        return json.loads((FILE_STATS / f"{stage}.json").read_text())
    except (OSError, ValueError):
        return {}


def _write_stats(stage: str, stats: dict) -> None:
    """Replace the stage's file (a lost write costs a hash at the next check, nothing else)."""
    path = FILE_STATS / f"{stage}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        FILE_STATS.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(stats, sort_keys=True))
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- params files
def raw_values(entries: dict) -> dict:
    """The raw values a stage's params entries (file -> keys, None = the whole file) point
    at: what both front ends compare."""
    values = {}
    for file, keys in entries.items():
        raw = read_yaml(Path(file))
        values[file] = raw if keys is None else {k: lookup(raw, k) for k in keys}
    return values


def lookup(tree, dotted: str):
    """The value at a dotted key of a nested mapping; KeyError when absent."""
    for part in dotted.split(".") if dotted else []:
        if not isinstance(tree, dict) or part not in tree:
            raise KeyError(dotted)
        tree = tree[part]
    return tree


def read_yaml(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: no such params file")
    stat = path.stat()
    return _read_yaml(str(path), stat.st_mtime_ns, stat.st_size)


SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's when built with it


class _UniqueKeysLoader(SAFE_LOADER):
    """The safe loader, refusing a key given twice in one mapping (PyYAML keeps the last one
    silently; DVC refuses such a file: the front ends would disagree)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"found the key {key!r} twice (keep one)",
                    key_node.start_mark,
                )
            seen.add(key) if isinstance(key, (str, int, float, bool)) else None
        return super().construct_mapping(node, deep)


def _safe_yaml(text: str):
    """``yaml.safe_load``, with libyaml's safe loader when PyYAML was built with it, refusing
    duplicate keys."""
    loader = _UniqueKeysLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


@cache
def _read_yaml(path: str, _mtime: int, _size: int) -> dict:
    try:
        raw = _safe_yaml(Path(path).read_text()) or {}
    except yaml.YAMLError as e:
        raise ParamsError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping of settings at the top level")
    return raw
