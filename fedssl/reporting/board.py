"""The benchmark board: every method of a pipeline side by side, accuracy beside its cost.

It branches on no method. It reads what the pipeline's report stage committed (its rows:
the probes' and the personalised evaluation's accuracies, the per-client traffic and the
``costs`` stage's columns) and the run records of the stages (``artifacts/.runs/``: wall
time, the machine), groups the runs that differ only in their seed, and writes into the
report's folder:

- ``board.md`` (and ``board_tables.md``, its tables alone, for the docs): one table per
  evaluation (self-supervised methods by their probes,
  personalised methods by each client's model on its own test split), a line per method,
  encoder and partition, mean ± SD over seeds, the costs beside; a ⚑ on what the board cannot
  vouch for (:data:`FLAGS_FILE`: a paper's ordering it inverts, a known diagnosis, a line
  below its zero-cost reference), its note under the table linking the diagnosis;
- ``board.json``: the same numbers, a DVC metric (``dvc metrics diff`` between two boards);
- ``stage_runs.json``: the run records it read (wall seconds, machine), which the next
  rendering falls back on, so a board made part by part keeps every part's wall time;
- ``board_accuracy_vs_MB.png`` and ``board_accuracy_vs_GFLOPs.png``, and the accuracy over
  the run per family (``board_over_run_encoders.png``, ``board_over_run_personalised.png``;
  every run's per-round curves are the report's ``curves.png``).

The budget rule that sets each method's rounds (:func:`rounds_within`) lives here too, with
the table of per-round times it was applied to (``python -m fedssl.reporting.board budget``).

``python -m fedssl.reporting.board render PIPELINE`` (``make benchmark`` runs it after the
pipeline); ``fedssl docs`` refills the docs' ``<!-- board: PIPELINE -->`` blocks from it.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ValidationError

from fedssl import evaluations
from fedssl.evaluations.costs import CLIENT_GFLOPS, CLIENT_MB_EXCHANGED
from fedssl.plan.layout import owner_of, report_dir
from fedssl.reporting import stats
from fedssl.reporting.formatting import markdown_table, mean_sd, number, sd_note, to_float
from fedssl.stage.record import ParamsError, read_yaml

SD = "sample"
# The stages' run records the board keeps beside itself (committed, so that the wall times
# of runs made by an earlier session survive a rendering elsewhere): of each, its wall time
# and what the caption says of its machine (:func:`hardware`), one stage a line.
RUNS_FILE = "stage_runs.json"
MACHINE_KEYS = ("host", "cpu_count", "gpu", "torch", "torch_threads", "FEDSSL_THREADS")


def _declared(table: str, label: str | None = None) -> dict[str, str]:
    """The declared accuracies whose ``board`` is ``table``: column -> header (their label,
    or ``label``)."""
    return {m.key: label or m.label for m in evaluations.accuracies() if m.board == table}


# The evaluations the board has a table for: name -> (heading, its accuracy columns: board
# column -> header, the declared metrics of that table). A run belongs to the first evaluation
# it has a column of; a line's first column it has is its accuracy (the one compared, plotted
# and ranked): for the personalised table the mean over the last rounds, then the declared
# final-round accuracy.
EVALUATIONS = {
    "ssl": ("Self-supervised and supervised encoders, probed (top-1 %)", _declared("ssl")),
    "personal": (
        "Personalised and clustered methods (top-1 %, each client's model on its own test split)",
        {"personal_last": "personal"} | _declared("personal", "last round"),
    ),
}
# The costs beside the accuracies (:func:`cost_columns`), per client, averaged over clients,
# then over seeds: the client costs declared to stand beside the accuracies
# (fedssl.evaluations.costs), then the rounds and the run's wall time (from the run records).
# `client_MB_exchanged` is every byte a client sent or received (the costs stage's ledger
# total, one-shot transfers included: MFCL's representation upload; else the rounds' traffic).
MB = CLIENT_MB_EXCHANGED.key
RUN_COSTS = {"rounds": "rounds", "wall_s": "wall s"}


def cost_columns() -> dict[str, str]:
    """The board's cost columns: column -> header."""
    beside = {m.key: m.label for m in evaluations.client_costs() if m.beside}
    return beside | RUN_COSTS


# personal_lastK: the clients' mean personalised accuracy averaged over the last K rounds
LAST_ROUNDS = re.compile(r"^personal_last(\d+)$")
SEED = re.compile(r"_s(?:eed)?(\d+)$")
# Per-round accuracies a round log may hold, by evaluation (the k-NN monitor, the clients'
# mean personalised accuracy), for the curves and the rounds to a target.
ROUND_ACCURACY = {"ssl": "knn_monitor", "personal": "personal_acc"}
TARGET_MARGIN = 3.0  # SSL target: the untrained network's round-0 monitor accuracy + 3 points


# ------------------------------------------------------------------ the cells
def client_mb(row: dict) -> float | None:
    """Every byte the average client sent or received, in MB: the costs stage's ledger total
    (:data:`MB`, one-shot transfers included), else the rounds' up + down."""
    total = to_float(row.get(MB))
    if total is not None:
        return total
    up, down = to_float(row.get("client_MB_up")), to_float(row.get("client_MB_down"))
    return None if up is None and down is None else (up or 0.0) + (down or 0.0)


def board_values(row: dict, wall: dict[str, float]) -> dict[str, float]:
    """A report row's numbers in the board's columns (blanks left out)."""
    values = {k: to_float(row.get(k)) for k in (*_declared("ssl"), *_declared("personal"))}
    last = [k for k in row if LAST_ROUNDS.match(k)]
    values["personal_last"] = to_float(row[last[0]]) if last else None
    values |= {k: to_float(row.get(k)) for k in cost_columns() if k not in (MB, "wall_s")}
    values |= {MB: client_mb(row), "wall_s": wall.get(row["experiment"])}
    return {k: v for k, v in values.items() if v is not None}


def evaluation_of(values: dict) -> str | None:
    """The board table a run belongs to (None: it has none of the board's accuracies)."""
    return next((e for e, (_, cols) in EVALUATIONS.items() if any(c in values for c in cols)), None)


def seed_of(experiment: str) -> str:
    """The seed an experiment's name ends with (``_s2``, ``_seed2``), else its name."""
    m = SEED.search(experiment)
    return m.group(1) if m else experiment


def cells(rows: Iterable[dict], wall: dict[str, float]) -> list[dict]:
    """The board's lines: the runs grouped by evaluation, method (the report's row label),
    encoder and partition (its column), in the order they first appear. Each line holds
    the runs' values of every accuracy and cost column (a list per column, missing ones left
    out; ``by_seed``: seed -> value), the runs' experiments, and the last rounds its
    personalised accuracy averages (``last_rounds``)."""
    out: dict[tuple, dict] = {}
    for row in rows:
        values = board_values(row, wall)
        evaluation = evaluation_of(values)
        if evaluation is None:
            continue
        key = (evaluation, row["row"], row.get("arch", ""), row["column"])
        cell = out.setdefault(
            key,
            {"evaluation": evaluation, "method": key[1], "encoder": key[2], "partition": key[3]}
            | {"runs": 0, "values": {}, "by_seed": {}, "experiments": [], "last_rounds": set()},
        )
        cell["runs"] += 1
        cell["experiments"].append(row["experiment"])
        cell["last_rounds"] |= {int(LAST_ROUNDS.match(k)[1]) for k in row if LAST_ROUNDS.match(k)}
        for column, v in values.items():
            cell["values"].setdefault(column, []).append(v)
            cell["by_seed"].setdefault(column, {})[seed_of(row["experiment"])] = v
    return list(out.values())


def cell_key(cell: dict) -> str:
    """A line's name in board.json: method, encoder and partition."""
    return " | ".join(p for p in (cell["method"], cell["encoder"], cell["partition"]) if p)


def accuracy_of(cell: dict) -> str | None:
    """The line's accuracy column: the first of its evaluation's that it has."""
    return next((c for c in EVALUATIONS[cell["evaluation"]][1] if c in cell["values"]), None)


def is_reference(cell: dict) -> bool:
    """A line that federates nothing: an encoder's untrained network (no round trained; MFCL's
    untrained stem still uploads its representations once), or the clients training alone
    (SOLO: no byte exchanged). Every other line of its encoder is read against it."""
    values = cell["values"]
    untrained = bool(values.get("rounds")) and not any(values["rounds"])
    exchanged = values.get(MB)  # none recorded (no ledger, no traffic): not known to be zero
    return untrained or (bool(exchanged) and not any(exchanged))


# ------------------------------------------------------------------ confidence
def compare_lines(cell_list: list[dict]) -> None:
    """For each evaluation and partition, every line against the best and against its
    reference (:func:`is_reference`, same encoder): the paired t-test over seeds
    (:func:`fedssl.reporting.stats.compare`), Holm-corrected over the partition's comparisons of
    each kind, into ``cell["vs_best"]`` / ``cell["vs_reference"]``. The best is the highest mean
    accuracy among the lines of two runs or more, which a test can compare with (on a board
    made part by part, a line's single first run would otherwise be the best and leave every
    comparison untested); the highest of all where no line has two."""
    groups: dict[tuple, list[dict]] = {}
    for cell in cell_list:
        if accuracy_of(cell):
            groups.setdefault((cell["evaluation"], cell["partition"]), []).append(cell)
    for mine in groups.values():
        testable = [c for c in mine if len(c["values"][accuracy_of(c)]) > 1]
        best = max(testable or mine, key=lambda c: statistics.mean(c["values"][accuracy_of(c)]))
        best["vs_best"] = {"verdict": "best"}
        others = [c for c in mine if c is not best]
        _verdicts(others, [best] * len(others), "vs_best")
        refs = {c["encoder"]: c for c in mine if is_reference(c)}
        trained = [c for c in mine if not is_reference(c) and c["encoder"] in refs]
        _verdicts(trained, [refs[c["encoder"]] for c in trained], "vs_reference")


def _verdicts(cells_: list[dict], against: list[dict], name: str) -> None:
    found = [
        stats.compare(c["by_seed"][accuracy_of(c)], o["by_seed"].get(accuracy_of(c), {}))
        for c, o in zip(cells_, against)
    ]
    for cell, other, comparison, p in zip(cells_, against, found, stats.holm([f.p for f in found])):
        verdict = "untested" if p is None else "separable" if p < stats.ALPHA else "not separable"
        cell[name] = {
            "against": other["method"],
            "difference": round(comparison.difference, 4),
            "p": None if comparison.p is None else round(comparison.p, 4),
            "p_holm": None if p is None else round(p, 4),
            "ci95": comparison.interval and [round(x, 4) for x in comparison.interval],
            "test": comparison.test,
            "verdict": verdict,
        }


def verdict_text(v: dict | None) -> str:
    """A comparison as a table cell: "best", "−3.1 [−4.0, −2.2] (p 0.004)" or "−0.4 [−2.9,
    +2.1] not separable (p 0.6)" (the difference in points, the 95 % interval of the paired
    difference, the Holm-adjusted p-value)."""
    if not v:
        return ""
    if v["verdict"] == "best":
        return "best"
    diff = f"{v['difference']:+.1f}".replace("-", "−")
    if v["verdict"] == "untested":
        return f"{diff} (n < 2)"
    if v.get("ci95"):
        diff += " [{:+.1f}, {:+.1f}]".format(*v["ci95"]).replace("-", "−")
    words = " not separable" if v["verdict"] == "not separable" else ""
    p = "p < 0.001" if v["p_holm"] < 0.001 else f"p {v['p_holm']:.2g}"
    return f"{diff}{words} ({p})"


def metrics(cell_list: list[dict]) -> dict:
    """board.json's numbers: per line, the mean and SD of every column (SD only over two
    runs or more), its accuracy's 95 % interval, its comparisons, and the runs."""
    spread = statistics.stdev if SD == "sample" else statistics.pstdev
    out = {}
    for cell in cell_list:
        numbers = {"runs": cell["runs"]}
        for column, values in cell["values"].items():
            numbers[f"{column}_mean"] = round(statistics.mean(values), 4)
            if len(values) > 1:
                numbers[f"{column}_sd"] = round(spread(values), 4)
        accuracy = accuracy_of(cell)
        ci = stats.interval(cell["values"][accuracy]) if accuracy else None
        if ci:
            numbers[f"{accuracy}_ci95"] = [round(ci[0], 4), round(ci[1], 4)]
        for name in ("vs_best", "vs_reference", "to_target"):
            if cell.get(name):
                numbers[name] = cell[name]
        if cell.get("flags"):
            numbers["flags"] = [
                {k: f[k] for k in ("kind", "column", "diagnosis")} for f in cell["flags"]
            ]
        out[cell_key(cell)] = numbers
    return out


# ------------------------------------------------------------------ flags
# What the board cannot vouch for, marked in its cell with a note under the table that links
# the line's diagnosis. The papers' orderings and the hand-written diagnoses are data (a file
# of judgments others edit as diagnoses arrive, validated on load); which ordering the board
# inverts, and which line sits below its zero-cost reference, the board computes.
FLAGS_FILE = Path("params/board_flags.yaml")
MARK = "⚑"
DOCS_FROM_REPORT = "../../../docs/results/"  # results/reports/PIPELINE/ -> docs/results/


class PaperOrdering(BaseModel, extra="forbid"):
    """A paper's ``above`` > ``below`` (two lines of one board table, by method): the
    ``above`` line is flagged on every partition where its mean accuracy is below
    ``below``'s."""

    above: str
    below: str
    paper: str  # where and by how much the paper puts it above
    diagnosis: str  # a link, relative to docs/results/


class KnownDiagnosis(BaseModel, extra="forbid"):
    """The lines a hand-written diagnosis is about (every line matching the given fields),
    flagged in ``column`` (a board column; the line's accuracy when not given)."""

    method: str | None = None
    encoder: str | None = None
    partition: str | None = None
    column: str | None = None
    says: str
    diagnosis: str


class BoardFlags(BaseModel, extra="forbid"):
    """One pipeline's entry of :data:`FLAGS_FILE`; ``below_reference``: the diagnosis a line
    below its zero-cost reference (:func:`is_reference`) links."""

    orderings: list[PaperOrdering] = []
    known: list[KnownDiagnosis] = []
    below_reference: str


def load_flags(pipeline: str, path: Path = FLAGS_FILE) -> BoardFlags | None:
    """The pipeline's flags (None: no file, or no entry for it: the board flags nothing)."""
    raw = read_yaml(path).get(pipeline) if path.exists() else None
    if raw is None:
        return None
    try:
        return BoardFlags.model_validate(raw)
    except ValidationError as e:
        fields = "; ".join(
            f"{pipeline}.{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()
        )
        raise ParamsError(f"{path}: {fields}") from None


BELOW_REFERENCE = (
    "Below its zero-cost reference (the same encoder untrained; each client alone, SOLO), "
    "by the vs reference column"
)


def flag_lines(cell_list: list[dict], flags: BoardFlags | None, path: Path = FLAGS_FILE) -> None:
    """Into ``cell["flags"]`` (a list of ``{"column", "kind", "note", "line", "diagnosis"}``:
    the note the flag shares with the other lines of its cause, and what it says of this
    line): the papers' orderings the board inverts, the known diagnoses, and every trained
    line whose accuracy is below its reference's (``vs_reference``: :func:`compare_lines`
    first). A flag that names no line of the board stops here, naming the file."""
    if flags is None:
        return
    _check_names(cell_list, flags, path)
    for cell in cell_list:
        cell["flags"] = []
    for order in flags.orderings:
        _flag_inversions(cell_list, order)
    for known in flags.known:
        for cell in cell_list:
            if all(
                getattr(known, k) in (None, cell[k]) for k in ("method", "encoder", "partition")
            ):
                column = known.column or accuracy_of(cell)
                if column in cell["values"]:
                    note = known.says[0].upper() + known.says[1:]
                    _add_flag(cell, column, "known", note, _line_name(cell), known.diagnosis)
    for cell in cell_list:
        v = cell.get("vs_reference")
        if v and v["difference"] < 0:
            line = f"{_line_name(cell)} against {v['against']}: {verdict_text(v)}"
            column = accuracy_of(cell)
            _add_flag(cell, column, "below reference", BELOW_REFERENCE, line, flags.below_reference)


def _line_name(cell: dict) -> str:
    return f"**{cell['method']}** ({cell['partition']})"


def _add_flag(cell: dict, column: str, kind: str, note: str, line: str, diagnosis: str) -> None:
    flag = {"column": column, "kind": kind, "note": note, "line": line, "diagnosis": diagnosis}
    cell["flags"].append(flag)


def _flag_inversions(cell_list: list[dict], order: PaperOrdering) -> None:
    """Flags ``order.above``'s line on each table and partition where its mean accuracy is
    below ``order.below``'s, with the difference paired by seed in its note."""
    lines = {(c["evaluation"], c["partition"], c["method"]): c for c in cell_list}
    for (evaluation, partition, method), cell in lines.items():
        other = lines.get((evaluation, partition, order.below))
        if method != order.above or other is None:
            continue
        column = accuracy_of(cell)
        if statistics.mean(cell["values"][column]) >= statistics.mean(
            other["values"].get(column, [-math.inf])
        ):
            continue
        found = stats.compare(cell["by_seed"][column], other["by_seed"].get(column, {}))
        points = f"{found.difference:+.1f}"
        points += " [{:+.1f}, {:+.1f}]".format(*found.interval) if found.interval else ""
        note = (
            f"The paper puts {order.above} above {order.below} ({order.paper}); here it is "
            f"below, in points (paired by seed, 95 % interval)"
        )
        line = f"{_line_name(cell)} {points.replace('-', '−')}"
        _add_flag(cell, column, "inverted", note, line, order.diagnosis)


def _check_names(cell_list: list[dict], flags: BoardFlags, path: Path) -> None:
    columns = {c for _, cols in EVALUATIONS.values() for c in cols}
    named = [("orderings", i, "above", o.above) for i, o in enumerate(flags.orderings)]
    named += [("orderings", i, "below", o.below) for i, o in enumerate(flags.orderings)]
    for i, known in enumerate(flags.known):
        named += [("known", i, k, getattr(known, k)) for k in ("method", "encoder", "partition")]
        if known.column is not None and known.column not in columns:
            raise ParamsError(
                f"{path}: known.{i}.column: '{known.column}' is no accuracy column of the "
                f"board ({', '.join(sorted(columns))})"
            )
    field = {"above": "method", "below": "method"}
    for section, i, key, name in named:
        if name is not None and not any(c[field.get(key, key)] == name for c in cell_list):
            raise ParamsError(f"{path}: {section}.{i}.{key}: no line of the board has '{name}'")


def flag_marks(cell: dict, column: str, notes: dict[tuple, dict]) -> str:
    """The marks of ``cell``'s flags in ``column`` (" ⚑1 ⚑2"), each note numbered the first
    time a line has it, in ``notes`` ((note, diagnosis) -> its number and lines; shared by a
    board's tables, so that a number means one note)."""
    marks = []
    for f in cell.get("flags", []):
        if f["column"] == column:
            note = notes.setdefault((f["note"], f["diagnosis"]), {"n": len(notes) + 1, "lines": []})
            note["lines"].append(f["line"])
            marks.append(note["n"])
    return "".join(f" {MARK}{n}" for n in sorted(marks))


def flag_notes(notes: dict[tuple, dict], links: str = "") -> str:
    """The notes under a table: each flag's words, its lines, and its diagnosis (``links``:
    what puts the docs' results pages before a diagnosis's link, for a page elsewhere)."""
    return "".join(
        f"- {MARK}{v['n']} {note}: {'; '.join(v['lines'])}. [Diagnosis]({links}{diagnosis})\n"
        for (note, diagnosis), v in notes.items()
    )


# ------------------------------------------------------------------ accuracy over the run
def run_curves(cell: dict, logs: dict[str, list[dict]]) -> list[list[tuple]]:
    """Per run of a line, its per-round accuracy (:data:`ROUND_ACCURACY`) as (round, accuracy,
    MB, GFLOPs, wall minutes): the MB a client had exchanged by that round (the run's ledger
    total shared out over the rounds as its round log's bytes are), its GFLOPs (the total,
    linear in the rounds) and its wall time so far (the rounds' logged seconds where the log
    keeps them, as the workspace's does; else, as in a committed log, which drops timings, the
    wall time of the run's stages shared out evenly over its rounds); empty for a run whose
    log has none."""
    key = ROUND_ACCURACY[cell["evaluation"]]
    out = []
    for i, exp in enumerate(cell["experiments"]):
        rows = logs.get(exp, [])
        traffic = [
            (to_float(r.get("bytes_up")) or 0) + (to_float(r.get("bytes_down")) or 0) for r in rows
        ]
        total_mb = _nth(cell["values"].get(MB), i)
        gflops = _nth(cell["values"].get(CLIENT_GFLOPS.key), i)
        run_s = _nth(cell["values"].get("wall_s"), i)
        sent, seconds, points = 0.0, 0.0, []
        for r, b in zip(rows, traffic):
            sent += b
            seconds += to_float(r.get("seconds")) or 0.0
            acc = to_float(r.get(key))
            if acc is None:
                continue
            rnd = int(r["round"])
            mb = total_mb * sent / sum(traffic) if total_mb and sum(traffic) else None
            flops = gflops * rnd / len(rows) if gflops else None
            wall_s = seconds or (run_s * rnd / len(rows) if run_s else None)
            points.append((rnd, acc, mb, flops, wall_s / 60 if wall_s else None))
        out.append(points)
    return out


def _nth(values, i):
    return values[i] if values and i < len(values) else None


def targets_of(cell: dict, refs: dict, logs: dict[str, list[dict]]) -> list[float | None]:
    """Per run of a line, the accuracy it should reach: for a personalised line its
    reference's (SOLO's) mean, for a self-supervised one its own network's round-0 k-NN
    monitor accuracy (the untrained twin, logged as ``knn_monitor_round0``) +
    :data:`TARGET_MARGIN`; for a run whose monitor logs no round 0 (the split ResNet's), its
    encoder's untrained reference line's mean k-NN top-1 (the full probe, within about a point
    of the monitor's reading on the small CNN) + the margin; None where there is neither."""
    ref = refs.get((cell["evaluation"], cell["encoder"], cell["partition"]))
    if cell["evaluation"] == "personal":
        mean = statistics.mean(ref["values"][accuracy_of(ref)]) if ref else None
        return [mean] * len(cell["experiments"])
    untrained = (
        statistics.mean(ref["values"]["knn_top1"]) if ref and "knn_top1" in ref["values"] else None
    )
    starts = [
        to_float((logs.get(e) or [{}])[0].get("knn_monitor_round0")) for e in cell["experiments"]
    ]
    starts = [untrained if s is None else s for s in starts]
    return [None if s is None else s + TARGET_MARGIN for s in starts]


def rounds_to_target(cell_list: list[dict], logs: dict[str, list[dict]]) -> None:
    """The rounds, MB and GFLOPs a line takes to first reach its target (:func:`targets_of`),
    each the median over its runs (a run that never does counts as never), with how many
    runs reached it; into ``cell["to_target"]``."""
    refs = {
        (c["evaluation"], c["encoder"], c["partition"]): c for c in cell_list if is_reference(c)
    }
    for cell in cell_list:
        curves, targets = run_curves(cell, logs), targets_of(cell, refs, logs)
        if is_reference(cell) or not any(curves) or all(t is None for t in targets):
            continue
        hits = [
            next((p for p in points if p[1] >= target), None) if target is not None else None
            for points, target in zip(curves, targets)
        ]

        def median(j: int) -> float | None:
            m = statistics.median(math.inf if h is None or h[j] is None else h[j] for h in hits)
            return None if math.isinf(m) else round(m, 4)

        cell["to_target"] = {
            "target": round(statistics.mean(t for t in targets if t is not None), 2),
            "reached": sum(h is not None for h in hits),
            "of": len(hits),
            "rounds": median(0),
            "MB": median(2),
            "GFLOPs": median(3),
        }


# ------------------------------------------------------------------ the tables
def hardware(records: Iterable[dict]) -> str:
    """The machines the runs' stages recorded, as a caption's words."""
    seen = []
    for r in records:
        env = r.get("environment", {})
        words = env.get("gpu") or f"{env.get('cpu_count', '?')}-core CPU"
        threads = env.get("FEDSSL_THREADS") or env.get("torch_threads")
        words += f", torch threads {threads}" if threads and not env.get("gpu") else ""
        words = f"{env.get('host', '?')} ({words}, torch {env.get('torch', '?')})"
        if words not in seen:
            seen.append(words)
    return "; ".join(seen) or "no run records"


def _interval_text(values: list[float]) -> str:
    ci = stats.interval(values)
    return f"[{ci[0]:.1f}, {ci[1]:.1f}]" if ci else ""


def _target_text(cell: dict) -> list[str]:
    t = cell.get("to_target")
    if not t:
        return ["", ""]
    if t["rounds"] is None:
        return [f"not reached ({t['reached']}/{t['of']})", ""]
    return [f"{t['rounds']:g}", number(t["MB"], ".3g")]


def _table_row(cell: dict, shown: list[str], costs: list[str], targets: bool, notes: dict):
    """A table's line of one method, encoder and partition (see :func:`table`)."""
    v, first = cell["values"], accuracy_of(cell)
    return (
        [cell["method"], cell["encoder"], cell["partition"], str(cell["runs"])]
        + [mean_sd(v.get(shown[0], []), SD, ".1f") + flag_marks(cell, shown[0], notes)]
        + [_interval_text(v.get(first, []))]
        + [verdict_text(cell.get("vs_best")), verdict_text(cell.get("vs_reference"))]
        + [mean_sd(v.get(c, []), SD, ".1f") + flag_marks(cell, c, notes) for c in shown[1:]]
        + [number(statistics.mean(v[c]), ".4g") if c in v else "" for c in costs]
        + (_target_text(cell) if targets else [])
    )


def _table_caption(evaluation: str, heading: str, mine: list[dict], machine: str) -> str:
    """What a table's columns mean (see :func:`table`)."""
    last = sorted({k for c in mine for k in c["last_rounds"]})
    words = ""
    if evaluation == "personal" and last:
        k = "/".join(map(str, last))
        words = f"; personal = the clients' mean accuracy averaged over the last {k} rounds"
    return (
        f"{heading}: {sd_note(SD, 'seeds')} (n = the runs column) and its 95 % interval "
        f"(Student's t){words}; vs best / vs reference: the difference in points from the "
        "partition's best line / from the line of the same encoder that exchanges nothing "
        "(the untrained network; SOLO) with the 95 % interval of the difference paired by seed "
        "(one comparison on its own), a paired t-test over seeds, p Holm-adjusted over the "
        "partition's comparisons, 'not separable' at p ≥ 0.05; MB sent + received: every byte "
        "the ledger counted, one-shot transfers included; costs are means "
        "per client and run (blank: the method has no costs stage); wall s = the run's own "
        f"stages (a stage shared by several runs counts in each); hardware: {machine}"
        + (
            f"; {MARK}n: a flag, its note under the table"
            if any(c.get("flags") for c in mine)
            else ""
        )
    )


def table(evaluation: str, cell_list: list[dict], machine: str, notes: dict | None = None) -> str:
    """One evaluation's table: a line per method, encoder and partition; its accuracy as
    mean ± SD over seeds with its 95 % interval and its comparisons (with the best line of
    its partition, with its reference), its other accuracies, then the costs as means and,
    where its runs log accuracy per round, the rounds and MB to the target. A flagged cell
    carries its marks, numbered in ``notes`` (:func:`flag_marks`)."""
    notes = {} if notes is None else notes
    heading, accuracies = EVALUATIONS[evaluation]
    mine = [c for c in cell_list if c["evaluation"] == evaluation]
    shown = [c for c in accuracies if any(c in cell["values"] for cell in mine)]
    headers = cost_columns()
    costs = [c for c in headers if any(c in cell["values"] for cell in mine)]
    targets = any(c.get("to_target") for c in mine)
    lines = [_table_row(cell, shown, costs, targets, notes) for cell in mine]
    header = ["method", "encoder", "partition", "runs", accuracies[shown[0]], "95 % CI"]
    header += ["vs best", "vs reference"] + [accuracies[c] for c in shown[1:]]
    header += [headers[c] for c in costs] + (
        ["rounds to target", "MB to target"] if targets else []
    )
    return markdown_table(header, lines, _table_caption(evaluation, heading, mine, machine))


def significance_text(cell_list: list[dict]) -> str:
    """The comparisons in words, per evaluation and partition: the best line, the lines
    separable from it and those not, and which lines beat their reference."""
    parts = []
    for evaluation, (heading, accuracies) in EVALUATIONS.items():
        by_partition: dict[str, list[dict]] = {}
        for c in cell_list:
            if c["evaluation"] == evaluation and c.get("vs_best"):
                by_partition.setdefault(c["partition"], []).append(c)
        for partition, mine in by_partition.items():
            best = next(c for c in mine if c["vs_best"]["verdict"] == "best")
            acc = accuracy_of(best)
            tied = [c["method"] for c in mine if c["vs_best"]["verdict"] == "not separable"]
            below = [c["method"] for c in mine if c["vs_best"]["verdict"] == "separable"]
            untested = [c["method"] for c in mine if c["vs_best"]["verdict"] == "untested"]
            ref = [c for c in mine if c.get("vs_reference")]
            above = [
                c["method"]
                for c in ref
                if c["vs_reference"]["verdict"] == "separable"
                and c["vs_reference"]["difference"] > 0
            ]
            under = [
                c["method"]
                for c in ref
                if c["vs_reference"]["verdict"] == "separable"
                and c["vs_reference"]["difference"] < 0
            ]
            level = [c["method"] for c in ref if c["vs_reference"]["verdict"] == "not separable"]
            text = (
                f"- **{partition}**, {accuracies[acc]}: best **{best['method']}** "
                f"({statistics.mean(best['values'][acc]):.1f}); not separable from it: "
                f"{', '.join(tied) or 'none'}; below it: {', '.join(below) or 'none'}"
                + (f"; untested (one run): {', '.join(untested)}" if untested else "")
            )
            if ref:
                text += (
                    f". Against the reference of their encoder: above {_names(above)}; "
                    f"not separable {_names(level)}; below {_names(under)}"
                )
            parts.append(text + ".")
        if by_partition:
            parts.insert(len(parts) - len(by_partition), f"\n*{heading}*\n")
    if not parts:
        return ""
    return (
        "**Which differences are significant** (paired t-test over seeds, Holm-adjusted per "
        "partition, α = 0.05; with 3 seeds a difference must be large and steady to "
        "separate):\n" + "\n".join(parts) + "\n"
    )


def _names(methods: list[str]) -> str:
    return ", ".join(methods) or "none"


def tables_text(
    cell_list: list[dict],
    machine: str,
    total_wall: float,
    pending: list[str] = (),
    failed: list[dict] = (),
    links: str = "",
) -> str:
    """The board's tables, what is significant, and its total wall time
    (``board_tables.md``, which the docs' block copies); a board made part by part says
    how many runs are still to come, and a run that stopped with an error (a diverged loss)
    is named with it: its line has one run fewer, and the reader should know why. Under a
    table, its flags' notes (``links``: :func:`flag_notes`)."""
    parts = []
    if pending:
        parts.append(f"*Partial board: {len(pending)} runs not made yet (named in report.md).*\n")
    if failed:
        named = "; ".join(f"`{f['experiment']}` ({f['stage']}: {f['error']})" for f in failed)
        parts.append(
            f"*{len(failed)} run(s) stopped with an error and are left out of their lines "
            f"(the runs column counts the others): {named}.*\n"
        )
    notes: dict[tuple, dict] = {}
    for evaluation, (heading, _) in EVALUATIONS.items():
        if any(c["evaluation"] == evaluation for c in cell_list):
            before = {k: len(v["lines"]) for k, v in notes.items()}
            text = table(evaluation, cell_list, machine, notes)
            mine = {  # the notes of this table, with its lines alone
                k: {"n": v["n"], "lines": v["lines"][before.get(k, 0) :]}
                for k, v in notes.items()
                if len(v["lines"]) > before.get(k, 0)
            }
            flagged = f"\n*Flags:*\n\n{flag_notes(mine, links)}" if mine else ""
            parts.append(f"**{heading}**\n\n{text}\n{flagged}")
    parts.append(significance_text(cell_list))
    return (
        "\n".join(p for p in parts if p)
        + f"\nTotal wall time of the pipeline's stages: {total_wall / 3600:.2f} h.\n"
    )


FIGURES = {
    "board_accuracy_vs_MB.png": "accuracy against every byte a client exchanged",
    "board_accuracy_vs_GFLOPs.png": "accuracy against client GFLOPs",
    "board_over_run_encoders.png": "self-supervised and supervised encoders over the run "
    "(k-NN monitor against rounds, wall time, MB, GFLOPs)",
    "board_over_run_personalised.png": "personalised methods over the run (the clients' mean "
    "accuracy against rounds, wall time, MB, GFLOPs)",
    "curves.png": "per-round curves of every run (the report's)",
}


def render(pipeline: str, tables: str, figures: Iterable[str] = FIGURES) -> str:
    """board.md's text: the tables and the figures."""
    shown = "".join(f"![{FIGURES[f]}]({f})\n" for f in FIGURES if f in figures)
    return f"# Benchmark board: pipeline `{pipeline}`\n\n{tables}\n{shown}"


def family_of(cell: dict) -> str:
    """A line's family in the board's figures: ``personalised`` or ``encoders``."""
    return "personalised" if cell["evaluation"] == "personal" else "encoders"


def panel_of(cell: dict) -> str:
    """A line's panel in the board's figures: its partition and family."""
    return f"{cell['partition']} · {family_of(cell)}"


def _reference_label(cell: dict) -> str:
    """A reference's level label: an untrained network by its name; a personalised
    reference (SOLO: each client alone) by its own."""
    return cell["method"] if cell["evaluation"] == "personal" else f"untrained {cell['encoder']}"


def plot(cell_list: list[dict], cost: str, label: str, path: Path) -> None:
    """Accuracy (the line's :func:`accuracy_of`) against a cost, one panel per evaluation and
    partition: a point per line with its SD over seeds, the Pareto front labelled, the lines
    that exchange nothing (or cost nothing) as dotted levels, a reference that does cost
    something (MFCL's untrained stem uploads its representations) as a hollow point
    (:func:`fedssl.reporting.figures.accuracy_vs_cost`)."""
    from fedssl.reporting.figures import accuracy_vs_cost

    panels, references, ylabels = {}, {}, {}
    for cell in cell_list:
        accuracy = accuracy_of(cell)
        if not accuracy:
            continue
        name = panel_of(cell)
        ys, xs = cell["values"][accuracy], cell["values"].get(cost)
        ylabels[name] = f"{EVALUATIONS[cell['evaluation']][1][accuracy]} top-1 %"
        y = statistics.mean(ys)
        if not xs or statistics.mean(xs) <= 0:
            references.setdefault(name, []).append({"label": _reference_label(cell), "y": y})
            panels.setdefault(name, [])
            continue
        panels.setdefault(name, []).append(
            {
                "x": statistics.mean(xs),
                "y": y,
                "err": statistics.stdev(ys) if len(ys) > 1 else 0.0,
                "label": cell["method"],
                "group": cell["encoder"],
                "reference": is_reference(cell),  # drawn hollow, never on the front
            }
        )
    for name, points in panels.items():
        references.setdefault(name, []).extend(_far_below(points, label.split(" /")[0]))
    order = sorted(panels, key=lambda n: (n.endswith("personalised"), list(panels).index(n)))
    accuracy_vs_cost(
        {n: panels[n] for n in order},
        label,
        ylabels,
        path,
        references=references,
    )


def _far_below(points: list[dict], unit: str, factor: float = 5.0) -> list[dict]:
    """Takes out of ``points`` the references that cost under a ``factor``-th of the panel's
    cheapest method and returns them as levels with their cost in the label (MFCL's untrained
    stem exports its representations in ~10 GFLOPs against the methods' 500-2,000: as a point
    it would stretch the log axis over decades where no method is)."""
    cheapest = min((p["x"] for p in points if not p["reference"]), default=None)
    far = [p for p in points if p["reference"] and cheapest and p["x"] * factor < cheapest]
    points[:] = [p for p in points if p not in far]
    return [{"label": f"{p['label']}\n({p['x']:.3g} {unit})", "y": p["y"]} for p in far]


# run_curves' fields the accuracy over the run is drawn against: field -> (axis, panel word)
def _distinct_levels(marks: list[tuple[str, str, float]]) -> list[tuple[str, float]]:
    """One labelled level per target value of a panel's ``(line, evaluation, target)``:
    what the target is, and, where the panel has several, whose it is."""
    by_value: dict[float, list[tuple[str, str]]] = {}
    for line, evaluation, y in marks:
        by_value.setdefault(round(y, 2), []).append((line, evaluation))
    levels = []
    for y, lines in by_value.items():
        what = "SOLO's accuracy" if lines[0][1] == "personal" else "untrained + 3"
        names = [n.split(" (")[0] for n, _ in lines]  # "FedProx (μ=0.01)" -> "FedProx"
        whose = ", ".join(names) if len(names) <= 3 else f"{len(names)} lines"
        levels.append((f"target: {what}" + (f" ({whose})" if len(by_value) > 1 else ""), y))
    return levels


# A point's field -> (its axis label, the panel's word): its round, the run's wall minutes,
# the client's MB and GFLOPs by that round (the declared costs' labels, on log scales).
COST_AXES = (CLIENT_MB_EXCHANGED.label, CLIENT_GFLOPS.label)
OVER_RUN_AXES = {
    0: ("round", "rounds"),
    4: ("wall minutes", "wall time"),
    2: (COST_AXES[0], "MB"),
    3: (COST_AXES[1], "FLOPs"),
}


def _over_run_rows(cells_: list[dict]):
    """A line's row in the accuracy-over-the-run figure: its panel, split by encoder where
    the panel's curves come from several (a ViT's curve among fifteen small CNNs' is
    unreadable, and families are compared on their own rounds)."""
    encoders: dict[str, set[str]] = {}
    for cell in cells_:
        encoders.setdefault(panel_of(cell), set()).add(cell["encoder"])

    def row_of(cell: dict) -> str:
        where = panel_of(cell)
        return f"{where} · {cell['encoder']}" if len(encoders[where]) > 1 else where

    return row_of


def over_run_file(family: str) -> str:
    """The accuracy-over-the-run figure of a family (``encoders``, ``personalised``): a file
    each, so each has its own colours and a key of its own lines."""
    return f"board_over_run_{family}.png"


def plot_over_run(cell_list: list[dict], logs: dict[str, list[dict]], folder: Path) -> list[str]:
    """Accuracy over the run (median over seeds) against rounds, wall time, MB and GFLOPs, a
    figure per family (:func:`over_run_file`) with a row of panels per partition whose runs
    log accuracy per round (a line per method); returns the files drawn."""
    drawn = [
        (cell, curves) for cell in cell_list if (curves := [c for c in run_curves(cell, logs) if c])
    ]
    families: dict[str, list] = {}
    for cell, curves in drawn:
        families.setdefault(family_of(cell), []).append((cell, curves))
    files = []
    for family, members in families.items():
        if _plot_family_over_run(members, folder / over_run_file(family), family):
            files.append(over_run_file(family))
    return files


def _plot_family_over_run(drawn: list[tuple[dict, list]], path: Path, family: str) -> bool:
    from fedssl.reporting.figures import learning_curves

    rows: dict[str, dict[int, dict]] = {}  # row -> field -> method -> runs
    marks: dict[str, list[tuple[str, str, float]]] = {}  # row -> its lines' targets
    panels_in_order = list(dict.fromkeys(panel_of(cell) for cell, _ in drawn))
    drawn = sorted(drawn, key=lambda d: panels_in_order.index(panel_of(d[0])))  # rows together
    row_of = _over_run_rows([cell for cell, _ in drawn])
    for cell, curves in drawn:
        target = (cell.get("to_target") or {}).get("target")
        if target is not None:
            mark = (cell["method"], cell["evaluation"], target)
            marks.setdefault(row_of(cell), []).append(mark)
        for j in OVER_RUN_AXES:
            runs = [([p[j] for p in c], [p[1] for p in c]) for c in curves]
            if all(x is not None for xs, _ in runs for x in xs):
                rows.setdefault(row_of(cell), {}).setdefault(j, {})[cell["method"]] = runs
    panels, xlabels, levels = {}, {}, {}
    for where, fields in rows.items():
        for j, (axis, word) in OVER_RUN_AXES.items():
            if j in fields:
                name = f"{where}\nagainst {word}"  # two lines: a row's name fills a panel
                panels[name], xlabels[name] = fields[j], axis
                levels[name] = _distinct_levels(marks.get(where, []))
    if not panels:
        return False
    metric = "the clients' mean" if family == "personalised" else "k-NN monitor"
    learning_curves(
        panels,
        {n: "accuracy, top-1 %" for n in panels},
        path,
        xlabel=xlabels,
        columns=len(OVER_RUN_AXES),
        log_x=[n for n, axis in xlabels.items() if axis in COST_AXES],
        title=f"Accuracy over the run, {family} ({metric}); dotted: the targets",
        levels=levels,
    )
    return True


# ------------------------------------------------------------------ run records
def run_records(
    dag, kept: dict | None = None, reported: set[str] | None = None
) -> tuple[dict[str, float], list[dict], float]:
    """From the stages' run records (:func:`fedssl.stage.base.run_record`): wall seconds per
    experiment (its own stages, shared ones counted in each), every record, and the
    pipeline's total (each stage once). ``kept`` (stage -> record, from the board's
    committed :data:`RUNS_FILE`) fills in the stages this workspace has not run: a board
    made over several sessions keeps the wall times of the runs an earlier one made.
    ``reported`` (the experiments the report has a row or a failure for) leaves out the
    records of runs that are not on the board: one stopped half-way, or removed after."""
    from fedssl.stage.context import run_record

    wanted = set(dag.stages)
    if reported is not None:
        wanted &= {s for exp in reported for s in dag.of_experiment.get(exp, ())}
    records = {
        name: r
        for name in dag.stages
        if name in wanted and (r := run_record(name) or (kept or {}).get(name))
    }
    wall = {  # an experiment run elsewhere, with no record kept, has no wall time
        exp: sum(records[s]["wall_seconds"] for s in dag.of_experiment[exp] if s in records)
        for exp in dag.experiments
        if any(s in records and owner_of(dag.stages[s].out) == exp for s in dag.of_experiment[exp])
    }
    total = sum(r["wall_seconds"] for r in records.values())
    return wall, list(records.values()), total


def kept_records(folder: Path) -> dict:
    """The run records a previous rendering of the board committed (stage -> record)."""
    try:
        return json.loads((folder / RUNS_FILE).read_text())
    except FileNotFoundError:
        return {}


def write_kept_records(folder: Path, records: Iterable[dict]) -> None:
    """:data:`RUNS_FILE`: what :func:`run_records` falls back on at the next rendering."""
    lines = []
    for r in sorted((r for r in records if "stage" in r), key=lambda r: r["stage"]):
        env = r.get("environment", {})
        machine = {k: env[k] for k in MACHINE_KEYS if k in env}
        kept = {"stage": r["stage"], "wall_seconds": r["wall_seconds"], "environment": machine}
        lines.append(f"{json.dumps(r['stage'])}: {json.dumps(kept)}")
    (folder / RUNS_FILE).write_text("{\n" + ",\n".join(lines) + "\n}\n")


def write_board(
    folder: Path,
    pipeline: str,
    rows: list[dict],
    wall,
    records,
    total,
    pending=(),
    failed=(),
    logs: dict[str, list[dict]] | None = None,
    flags_file: Path = FLAGS_FILE,
) -> dict:
    """board.md, board.json and the figures in ``folder`` (``logs``: experiment -> its round
    log's rows, for the accuracy over the run; ``flags_file``: :data:`FLAGS_FILE`, the
    pipeline's entry flags its lines); returns board.json's content."""
    cell_list = cells(rows, wall)
    compare_lines(cell_list)
    flag_lines(cell_list, load_flags(pipeline, flags_file), flags_file)
    rounds_to_target(cell_list, logs or {})
    tables = tables_text(cell_list, hardware(records), total, pending, failed)
    # board.md sits in the report's folder: its links reach the docs' results pages
    page = tables_text(cell_list, hardware(records), total, pending, failed, DOCS_FROM_REPORT)
    folder.mkdir(parents=True, exist_ok=True)
    headers = cost_columns()
    plot(cell_list, MB, headers[MB], folder / "board_accuracy_vs_MB.png")
    gflops = CLIENT_GFLOPS.key
    plot(cell_list, gflops, headers[gflops], folder / "board_accuracy_vs_GFLOPs.png")
    drawn = [f for f in FIGURES if f.startswith("board_accuracy_vs")]
    for stale in folder.glob("board_over_run_*.png"):
        stale.unlink()  # a family no longer drawn leaves no figure behind
    drawn += plot_over_run(cell_list, logs or {}, folder)
    (folder / "board_tables.md").write_text(tables)
    (folder / "board.md").write_text(render(pipeline, page, [*drawn, "curves.png"]))
    board = {"total_wall_hours": round(total / 3600, 3), "lines": metrics(cell_list)}
    (folder / "board.json").write_text(json.dumps(board, indent=1, ensure_ascii=False) + "\n")
    write_kept_records(folder, records)
    return board


# ------------------------------------------------------------------ the budget rule
def rounds_within(budget_s: float, fixed_s: float, round_s: float, least: int = 1) -> int:
    """The rounds of a run that gets ``budget_s`` seconds: what is left after its fixed work
    (probes, export, server steps: ``fixed_s``) divided by the seconds of one round, at least
    ``least`` rounds (one, or what the method needs to be itself)."""
    if round_s <= 0:
        raise ValueError(f"round_s: a round takes a positive time, got {round_s}")
    return max(least, math.floor((budget_s - fixed_s) / round_s))


def per_run_budget(total_s: float, shared_s: float, runs: int) -> float:
    """The rule: every run of the board gets the same wall time, the total less the shared
    upstream work (data, partitions) divided by the number of runs."""
    if runs < 1:
        raise ValueError(f"runs: expected at least one run, got {runs}")
    return (total_s - shared_s) / runs


BUDGET_FILE = Path("benchmarks/board_budget.tsv")
BUDGET_TOTAL_S = 3 * 3600  # the board on a 2-core CPU
BUDGET_SHARED_S = 60  # data set and the three partitions


def budget_table(path: Path = BUDGET_FILE) -> list[dict]:
    """The measured table (a line per method: runs in the board, seconds per round and fixed
    seconds per run) with the rule's rounds and the estimated wall time of its runs."""
    lines = list(csv.DictReader(open(path), delimiter="\t"))
    runs = sum(int(line["runs"]) for line in lines)
    budget = per_run_budget(BUDGET_TOTAL_S, BUDGET_SHARED_S, runs)
    for line in lines:
        r, f = float(line["round_s"]), float(line["fixed_s"])
        line["rounds"] = rounds_within(budget, f, r, int(line.get("least_rounds") or 1))
        line["estimate_s"] = round(int(line["runs"]) * (f + line["rounds"] * r))
    return lines


def budget_markdown(lines: list[dict]) -> str:
    """The budget table as the docs show it, with the board's estimated total."""
    rows = [
        [x["preset"], x["rounds_key"], str(x["runs"]), x["round_s"], x["fixed_s"]]
        + [str(x["rounds"]), number(x["estimate_s"] / 60, ".1f")]
        for x in lines
    ]
    total = sum(x["estimate_s"] for x in lines) / 3600
    header = ["preset", "rounds setting", "runs", "s / round", "fixed s / run", "rounds"]
    caption = (
        f"The budget rule on {BUDGET_FILE} (estimated wall seconds on the 2-core CPU): "
        f"estimated board total {total:.2f} h"
    )
    return markdown_table(header + ["estimate min"], rows, caption)


# ------------------------------------------------------------------ the second board's plan
# Rounds set per family, not by one wall budget: the plan (a line per grid of the `board`
# pipeline, or per variant of a grid) names the first board's line whose measured wall times
# it takes (its committed per-stage times, results/runs/benchmark.tsv), its rounds and runs,
# a factor on the round's time where its local schedule differs (MpFedcon's paper regime:
# 11 local epochs where the first board ran 3) and its k-NN monitor evaluations.
PLAN_FILE = Path("benchmarks/board_plan.tsv")
MEASURED_FILE = Path("results/runs/benchmark.tsv")
MEASURED_REPORT = Path("results/reports/benchmark/report.json")
ROUND_STEPS = {"pretrain", "train", "cfl", "grow_1", "grow_2", "grow_3"}  # they run the rounds
MONITOR_CALL_S = 2.0  # one k-NN monitor evaluation on the small CNN (bank 5,000, queries 2,000)
STAGES_AT_ONCE = 2  # the 2-core CPU runs two one-thread stages at a time


# the grid axes that set a run's partition and seed (params/grids.yaml), not its method
RUN_AXES = ("bench_part", "bench_seed", "board_run", "board_skew_run", "board_run_mfcl",
            "board_skew_run_cpcfl")  # fmt: skip


def line_of(experiment: str, members: dict) -> str:
    """A board experiment's line in the plan: its grid, with the labels of its axes other
    than the partition and seed (``bench_personal:fedrep``)."""
    grid, labels = members.get(experiment, (experiment, {}))
    variant = [v for k, v in labels.items() if k not in RUN_AXES]
    return ":".join([grid, *variant]) if variant else grid


def measured_times(
    runs_file: Path = MEASURED_FILE, report: Path = MEASURED_REPORT, members: dict | None = None
) -> dict[str, dict]:
    """Per line of the first board: its runs' mean wall seconds per round (its round steps'
    wall over its rounds) and of its other stages (probes, costs, export, server steps), from
    the committed per-stage times (each stage counted with the experiment that owns it)."""
    if members is None:
        from fedssl.presets import Presets

        members = Presets().grid_members("experiment")
    rounds = {r["experiment"]: r["rounds"] for r in json.loads(report.read_text())["rows"]}
    lines: dict[str, dict] = {}
    with open(runs_file) as f:
        for r in csv.DictReader((x for x in f if not x.startswith("#")), delimiter="\t"):
            line = lines.setdefault(line_of(r["experiment"], members), {"round": {}, "fixed": {}})
            kind = "round" if r["stage"] in ROUND_STEPS else "fixed"
            line[kind][r["experiment"]] = line[kind].get(r["experiment"], 0.0) + float(
                r["wall_seconds"]
            )
    out = {}
    for name, line in lines.items():
        runs = set(line["round"]) | set(line["fixed"])
        per_round = [line["round"][e] / rounds[e] for e in line["round"] if rounds.get(e)]
        out[name] = {
            "round_s": round(statistics.mean(per_round), 2) if per_round else 0.0,
            "fixed_s": round(sum(line["fixed"].values()) / len(runs), 2),
        }
    return out


def plan_table(path: Path = PLAN_FILE, measured: dict | None = None) -> list[dict]:
    """The plan's lines with their estimated wall seconds on the 2-core CPU (one thread):
    runs x (rounds x the measured round x its factor + the measured fixed seconds + the
    monitor's evaluations)."""
    measured = measured_times() if measured is None else measured
    lines = list(csv.DictReader(open(path), delimiter="\t"))
    for line in lines:
        if line["measured_as"] not in measured:
            raise KeyError(
                f"{path}: measured_as '{line['measured_as']}' is no line of {MEASURED_FILE}"
            )
        m = measured[line["measured_as"]]
        run_s = int(line["rounds"]) * m["round_s"] * float(line["round_scale"]) + m["fixed_s"]
        run_s += int(line["monitor_calls"]) * MONITOR_CALL_S
        line.update(round_s=m["round_s"], fixed_s=m["fixed_s"], run_s=round(run_s, 1))
        line["estimate_s"] = round(int(line["runs"]) * run_s)
    return lines


def plan_markdown(lines: list[dict]) -> str:
    """The plan as the README shows it: a line per grid (or variant), then the hours of each
    part (two stages at a time on the 2-core CPU) and of the whole board."""
    rows = [
        [x["part"], x["grid"], x["rounds"], x["runs"], number(x["round_s"], "g")]
        + [number(x["fixed_s"], "g"), x["round_scale"], number(x["run_s"] / 60, ".1f")]
        for x in lines
    ]
    header = ["part", "line", "rounds", "runs", "s / round", "fixed s", "round x", "min / run"]
    parts: dict[str, float] = {}
    for x in lines:
        parts[x["part"]] = parts.get(x["part"], 0.0) + x["estimate_s"] / STAGES_AT_ONCE / 3600
    hours = ", ".join(f"{p} {h:.2f} h" for p, h in parts.items())
    caption = (
        f"The second board's plan ({PLAN_FILE}): per-round and fixed wall seconds of each line "
        f"as the first board measured them ({MEASURED_FILE}; one thread, two stages at a time), "
        f"the k-NN monitor at {MONITOR_CALL_S:g} s an evaluation; estimated wall hours of the "
        f"2-core CPU per part: {hours}; in all {sum(parts.values()):.2f} h"
    )
    return markdown_table(header, rows, caption)


# ------------------------------------------------------------------ the docs' board blocks
_BLOCK = re.compile(r"(<!-- board: (\w+) -->\n)(.*?)(<!-- /board -->)", re.S)


def fill_blocks(text: str, results: Path = Path("results/reports")) -> str:
    """``text`` with every ``<!-- board: PIPELINE -->`` block refilled from that pipeline's
    ``board_tables.md``; a block whose board has not run yet stays as it is."""

    def fill(m: re.Match) -> str:
        path = results / m.group(2) / "board_tables.md"
        return m.group(1) + path.read_text() + m.group(4) if path.exists() else m.group(0)

    return _BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fedssl board")
    sub = ap.add_subparsers(dest="command", required=True)
    draw = sub.add_parser("render", help="write the board from a pipeline's committed report")
    draw.add_argument("pipeline", nargs="?", default="benchmark")
    sub.add_parser("budget", help="the budget rule applied to benchmarks/board_budget.tsv")
    sub.add_parser("plan", help="the second board's parts and their estimated CPU hours")
    args = ap.parse_args(argv)
    if args.command == "budget":
        print(budget_markdown(budget_table()))
        return 0
    if args.command == "plan":
        print(plan_markdown(plan_table()))
        return 0
    from fedssl.plan.dag import Dag
    from fedssl.reporting.report import load_saved, read_round_log, round_logs

    folder = Path(report_dir(args.pipeline))
    try:
        saved = load_saved(folder)
    except (FileNotFoundError, KeyError) as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 1
    dag = Dag(args.pipeline)
    reported = {r["experiment"] for r in saved["rows"]}
    reported |= {f["experiment"] for f in saved.get("failed", [])}
    wall, records, total = run_records(dag, kept_records(folder), reported)
    try:
        write_board(
            folder,
            args.pipeline,
            saved["rows"],
            wall,
            records,
            total,
            saved.get("pending", []),
            saved.get("failed", []),
            {name: read_round_log(paths) for name, paths in round_logs(dag).items()},
        )
    except ParamsError as e:  # the flags file: its message names the field
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {folder}/board.md, board.json and its figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
