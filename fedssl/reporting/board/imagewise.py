"""Test-image noise in the planned questions: where every run of both lines kept its per-image
record, a question's difference gets a second interval from the two-level bootstrap (runs,
then their test images; for personalised lines, runs, clients, then their images) and
McNemar's exact test per seed (:mod:`fedssl.reporting.resampling`). The records: the probes'
``predictions.npz``, committed beside the evaluation's metrics; a personalised step's
``personal.npz`` (its final round), in the workspace's artifacts. A run that predates them
has none: the question then says so and its interval covers the seeds alone."""

from __future__ import annotations

from pathlib import Path

from fedssl.data import load_npz
from fedssl.eval.predictions import FILE as PREDICTIONS
from fedssl.eval.predictions import correctness
from fedssl.reporting.board.cells import accuracy_of, seed_of
from fedssl.reporting.resampling import (
    DRAWS,
    mcnemar_per_seed,
    personal_correctness,
    two_level_bootstrap,
)

PERSONAL_RECORD = "personal.npz"  # what a personalised step writes (fedssl.eval.personal)

__all__ = ["DRAWS", "cell_text", "image_bootstrap", "record_files"]


def record_files(dag) -> dict[str, dict[str, Path]]:
    """Per experiment, the per-image records that exist, by the board's evaluation: ``ssl``
    the probes' predictions its evaluation committed, ``personal`` the record its step wrote."""
    found: dict[str, dict[str, Path]] = {}
    for exp in dag.experiments:
        for name in dag.of_experiment[exp]:
            stage = dag.stages[name]
            paths = [Path(r) for r in stage.results if Path(r).name == PREDICTIONS]
            for path in paths:
                if path.exists():
                    found.setdefault(exp, {})["ssl"] = path
            personal = Path(stage.out) / PERSONAL_RECORD
            if personal.exists():
                found.setdefault(exp, {})["personal"] = personal
    return found


def _run(path: Path, evaluation: str, column: str):
    """A run's per-test-image correctness (clients -> images for a personalised run)."""
    if evaluation == "personal":
        return personal_correctness(**load_npz(path, ("labels", "probs", "client")))
    return correctness(path, column)


def _runs(cell: dict, seeds: list[str], files: dict, column: str) -> dict | None:
    """The line's runs of ``seeds`` (seed -> correctness); None unless every one has its
    record."""
    by_seed = {seed_of(e): e for e in cell["experiments"]}
    paths = [files.get(by_seed[s], {}).get(cell["evaluation"]) for s in seeds]
    if not seeds or any(p is None for p in paths):
        return None
    return {s: _run(p, cell["evaluation"], column) for s, p in zip(seeds, paths)}


def image_bootstrap(a: dict, b: dict, files: dict[str, dict[str, Path]], draws: int) -> dict | None:
    """Line ``a`` minus line ``b`` (cells of one evaluation and partition) on the seeds both
    ran, from their per-image records: the bootstrap's estimate (points), SE and 95 %
    interval, and McNemar per seed (images only ``a`` got right, only ``b``, exact p); None
    where a record is missing or the lines were read on different accuracy columns."""
    column = accuracy_of(a)
    if column != accuracy_of(b):
        return None
    seeds = sorted(set(a["by_seed"][column]) & set(b["by_seed"][column]))
    runs_a, runs_b = _runs(a, seeds, files, column), _runs(b, seeds, files, column)
    if runs_a is None or runs_b is None:
        return None
    boot = two_level_bootstrap(list(runs_a.values()), list(runs_b.values()), draws)
    found = {"difference": round(boot.estimate, 4), "se": round(boot.se, 4)}
    found["ci95"] = [round(x, 4) for x in boot.interval]
    if a["evaluation"] != "personal":  # one test set: the same images for both lines
        tests = mcnemar_per_seed(runs_a, runs_b)
        found["mcnemar"] = {s: [t.only_a, t.only_b, float(f"{t.p:.4g}")] for s, t in tests.items()}
    return found


def cell_text(found: dict | None) -> str:
    """The questions table's cell: "+1.2 [+0.4, +2.0]; McNemar p 0.01, 0.2, 0.03" or "—"."""
    if not found:
        return "—"
    text = "{:+.1f} [{:+.1f}, {:+.1f}]".format(found["difference"], *found["ci95"])
    if found.get("mcnemar"):
        ps = ", ".join(f"{p:.2g}" for _, _, p in found["mcnemar"].values())
        text += f"; McNemar p {ps}"
    return text.replace("-", "−")
