"""The plan as data: one small JSON record per stage (``pipelines/plan/<stage>.json``),
written by ``python -m fedssl.pipeline write`` (and by the Snakefile as it plans) from the DAG.

A record says what the stage runs and reads: its command, the params keys it reads (and the
digest of their values), its inputs (upstream stages and their output folders), its outputs,
its code dependencies, the hooks it calls and the method whose stage it is. The stage runtime
(:mod:`fedssl.stage`) reads its record instead of rebuilding the DAG, so a stage's code is what
it runs, not the planner: editing the planner, adding a data set or an evaluation reruns only
the stages whose records change. Both front ends list the record as the stage's dependency
(a DVC dep; for Snakemake its digest is part of the fingerprint).

This module imports nothing of the project but the hashes: the stage runtime reads it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fedssl.plan.fingerprint import hash_file, recorded
from fedssl.plan.layout import PLAN_RECORDS

# The precision policy: the stage runtime imports it by name, for a stage that computes on a
# device (its record's ``gpu``), so the planner names it among those stages' code only.
PRECISION = "fedssl.precision"


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


def write_records(records: list[dict]) -> list[Path]:
    """Write each record whose text changed (an unchanged one keeps its file untouched);
    returns the files written."""
    written = []
    for record in records:
        path, text = record_path(record["stage"]), record_text(record)
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text)
            tmp.replace(path)  # atomic: a stage starting now reads the old record or the new one
            written.append(path)
    return written


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
