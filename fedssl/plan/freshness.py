"""When a stage must run, the same for both front ends, and Snakemake's view of it.

DVC compares each stage's command, params, code and inputs itself. For Snakemake every stage
has a *fingerprint* (:meth:`fedssl.plan.dag.Dag.fingerprint`): a hash of the same command,
params values and code, and of the *output digests* its upstream stages recorded in their
``meta.json``; a stage records the fingerprint it ran with (and what went into it) in its own
``meta.json``. Before Snakemake plans, :func:`sync_receipts` compares them, says why each stale
stage must run, and gives Snakemake its view of the DAG: each rule's output is a receipt file
that exists, dated 1970, when the stage is up to date, and is removed when it must run.
Snakemake never sees the real outputs, so it cannot delete them before a job (stages replace
their outputs atomically, on success only), file times restored by ``dvc checkout`` do not
matter, and after one front end ran the other sees nothing to do. Like DVC, it sees a file a
stage wrote that changed since (a flipped byte, an edited report, a file added to an output):
each is checked against the SHA-256 its stage recorded, hashing only the files whose size,
mtime or inode moved (:func:`fedssl.stage.record.changed_files`), and the stage runs again, the
message naming the file and what restores it instead. The report's files, which ``snakemake
--report`` shows, are declared through copies beside its receipt (:func:`shown`), never as
themselves: Snakemake would delete the committed report before every report job and after a
failed one. Planning also removes what killed stages left behind (:func:`tidy`).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

from fedssl.data.catalog import missing_data
from fedssl.params import ParamsError
from fedssl.plan.dag import Dag
from fedssl.plan.layout import ARTIFACTS
from fedssl.stage.record import changed_files
from fedssl.stage.runtime import (
    RESUME_DIR,
    StageFailed,
    remove_dead,
    remove_dead_scratch,
    run_holder,
    stage_lock,
)

STAMPS = ARTIFACTS / ".receipts"
RAN_LOG = STAMPS / "ran-by-snakemake"


def why_stale(dag: Dag, name: str) -> list[str]:
    """Why a stage must run, by what changed since its last run (empty: up to date)."""
    stage = dag.stages[name]
    try:
        meta = json.loads((Path(stage.out) / "meta.json").read_text())
    except (OSError, ValueError):
        return ["not run yet"]
    if meta.get("fingerprint") == dag.fingerprint(name):
        # a file it wrote changed, went missing or was added since (DVC sees it too)
        recorded = meta.get("files", {})
        return [damaged(f, stage, recorded) for f in changed_files(name, stage.out, recorded)]
    old, new = meta.get("inputs", {}), dag.fingerprint_inputs(name)
    reasons = ["command changed"] if old.get("cmd") != new["cmd"] else []
    reasons += ["plan record changed"] if old.get("plan") != new["plan"] else []
    for file, values in new["params"].items():
        before = old.get("params", {}).get(file, {})
        keys = values if isinstance(values, dict) and isinstance(before, dict) else {}
        changed = (
            [k for k in keys if before.get(k) != values[k]]
            if keys
            else ([] if before == values else ["(whole file)"])
        )
        reasons += [f"params {file}: {k}" for k in changed]
    code = [f for f in new["code"] if old.get("code", {}).get(f) != new["code"][f]]
    reasons += [f"code {f}" for f in code]
    reasons += [
        f"input of {u} changed"
        for u, d in new["upstream"].items()
        if old.get("upstream", {}).get(u) != d
    ]
    return reasons or ["its recorded fingerprint differs"]


def damaged(path: str, stage, recorded: dict[str, str]) -> str:
    """Why a stage must run, for one of its files that is not as it wrote it (``recorded``:
    the digests in its meta.json), and what restores it instead: git for a committed result,
    DVC's cache for an output."""
    if path not in recorded:
        return f"{path} is not among the files it wrote (deleting it keeps the stage as it is)"
    if not Path(path).exists():
        return f"{path} missing"
    restore = f"git checkout -- {path}" if path in stage.committed else f"dvc checkout {stage.out}"
    return (
        f"{path} changed since it was written (its SHA-256 differs from the one in "
        f"{stage.out}/meta.json; `{restore}` restores it instead)"
    )


def stale_stages(dag: Dag) -> dict[str, list[str]]:
    """Stages that must run, with why: what changed, or an upstream stage that must run."""
    stale: dict[str, list[str]] = {}
    for name, stage in dag.stages.items():  # upstream first
        reasons = why_stale(dag, name)
        reasons += [f"{u} will run" for u in stage.upstream if u in stale]
        if reasons:
            stale[name] = reasons
    return stale


def receipt(name: str) -> Path:
    return STAMPS / f"{name}.done"


def shown_files(stage) -> list[str]:
    """The committed files of ``stage`` that ``snakemake --report`` shows: the report's."""
    return stage.committed if stage.kind == "report" else []


def shown(name: str, path: str) -> Path:
    """Where Snakemake sees stage ``name``'s committed file ``path`` (for ``snakemake
    --report``): a copy beside its receipt, which Snakemake may delete before the job and
    after a failed one; the committed file lands only when the stage succeeds."""
    return STAMPS / name / path


def show_command(name: str, committed: list[str]) -> str:
    """The shell words that copy a stage's committed files to where Snakemake sees them (run
    once the stage succeeded; ``true`` for none)."""
    words = [
        f"mkdir -p {shlex.quote(str(shown(name, p).parent))} && "
        f"cp -p {shlex.quote(p)} {shlex.quote(str(shown(name, p)))}"
        for p in committed
    ]
    return " && ".join(words) or "true"


def sync_receipts(dag: Dag) -> dict[str, list[str]]:
    """Snakemake's view of the DAG (see module doc): each stage's receipt exists, dated 1970,
    when the stage is up to date (with the copies of its :func:`shown_files`), and is removed
    when it must run (so Snakemake runs it and everything after it). Returns the stages that
    must run, with why."""
    STAMPS.mkdir(parents=True, exist_ok=True)
    stale = stale_stages(dag)
    for name, stage in dag.stages.items():
        copies = {p: shown(name, p) for p in shown_files(stage)}
        if name in stale:
            receipt(name).unlink(missing_ok=True)
            shutil.rmtree(STAMPS / name, ignore_errors=True)
            continue
        receipt(name).write_text("up to date\n")
        for path, copy in copies.items():
            if Path(path).exists():  # else Snakemake misses the copy and runs the stage
                copy.parent.mkdir(parents=True, exist_ok=True)
                # dated as the file (newer than any receipt; a zip report refuses 1970)
                shutil.copy2(path, copy)
        os.utime(receipt(name), (0, 0))
    return stale


def tidy(dag: Dag, stale: dict[str, list[str]]) -> list[Path]:
    """Remove what killed stages left behind: their scratch folders (a stage's partial output,
    its results written aside) and files of processes that are gone, and the checkpoints of
    stages that are up to date (``stale``: those that must run), which no run resumes. Not
    while a run of either front end is in progress, nor for a stage running now. Returns what
    was removed."""
    if run_holder() is not None:
        return []
    removed = remove_dead(RESUME_DIR, "*.tmp-*")  # a checkpoint's write cut short
    for name, stage in dag.stages.items():
        try:
            with stage_lock(name):
                removed += remove_dead_scratch(Path(stage.out))
                for checkpoint in [] if name in stale else RESUME_DIR.glob(f"{name}.*"):
                    checkpoint.unlink()
                    removed.append(checkpoint)
        except StageFailed:  # it is running
            continue
    return removed


def check_data(dag: Dag) -> None:
    """Before running: every data set a stale prepare stage will read must be there (the
    message says how to get it), so a missing one stops a front end before any stage."""
    for stage in dag.stages.values():
        if stage.kind == "prepare_data" and why_stale(dag, stage.name):
            name = stage.name.split("__", 1)[1]
            params = dag.presets.load("dataset", name)
            problem = missing_data(params.name, params.data_root, params.download)
            if problem:
                where = dag.presets.resolve("dataset", name).where
                raise ParamsError(f"{where}: data set not available: {problem}")


def accept(dag: Dag, names: list[str] | None = None) -> list[str]:
    """Declare stages up to date without running them: their recorded fingerprint becomes the
    current one (e.g. after an edit of code or params that cannot change their outputs, such
    as a comment). Only stages whose outputs exist; upstream first. Returns the stages accepted
    (then `dvc commit` them for DVC). The outputs are not checked: use with care."""
    accepted = []
    for name, stage in dag.stages.items():
        meta_path = Path(stage.out) / "meta.json"
        if (names and name not in names) or not meta_path.exists() or not why_stale(dag, name):
            continue
        meta = json.loads(meta_path.read_text())
        meta.update(fingerprint=dag.fingerprint(name), inputs=dag.fingerprint_inputs(name))
        meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True, default=float) + "\n")
        accepted.append(name)
    return accepted
