"""The board's cells: a run's numbers (accuracies, costs, wall time) grouped over seeds into
a line per method, encoder and partition; and the accuracy over the run (rounds to a target)."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ValidationError

import fedssl.reporting.board.simulate as simulate
import fedssl.reporting.board.steps as steps
from fedssl import evaluations
from fedssl.evaluations.costs import CLIENT_GFLOPS, CLIENT_MB_ENCODER, CLIENT_MB_EXCHANGED
from fedssl.reporting.board.simulate import simulated
from fedssl.reporting.formatting import to_float
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
# (fedssl.evaluations.costs), then the rounds, a client's optimizer steps a round (from the
# params: :mod:`.steps`) and the run's wall time (from the run records).
# `client_MB_exchanged` is every byte a client sent or received (the costs stage's ledger
# total, one-shot transfers included: MFCL's representation upload; else the rounds' traffic).
MB = CLIENT_MB_EXCHANGED.key


# The run's wall seconds stay a value of the line (the curves against wall time) but leave
# the table: on a shared CPU they measure contention; the simulated seconds per round
# (:mod:`.simulate`) stand in their place.
RUN_COSTS = {"rounds": "rounds", steps.COLUMN: steps.HEADER}


def cost_columns() -> dict[str, str]:
    """The board's cost columns: column -> header (the client costs declared beside, the
    encoder's MB after the total MB, the total GFLOPs after the client's, the rounds, the
    simulated seconds per round per profile)."""
    out = {}
    for m in evaluations.client_costs():
        if m.beside:
            out[m.key] = m.label
        if m.key == CLIENT_MB_EXCHANGED.key:
            out[CLIENT_MB_ENCODER.key] = CLIENT_MB_ENCODER.label
        if m.key == CLIENT_GFLOPS.key:
            out[simulate.TOTAL] = "total GFLOPs / client (+ server's)"
    sim = {simulate.column(n): f"s / round, {n} (sim.)" for n in simulate.PROFILES}
    return out | RUN_COSTS | sim


# personal_lastK: the clients' mean personalised accuracy averaged over the last K rounds
LAST_ROUNDS = re.compile(r"^personal_last(\d+)$")


SEED = re.compile(r"_s(?:eed)?(\d+)$")


# Per-round accuracies a round log may hold, by evaluation (the k-NN monitor, the clients'
# mean personalised accuracy), for the curves and the rounds to a target.
ROUND_ACCURACY = {"ssl": "knn_monitor", "personal": "personal_acc"}


TARGET_MARGIN = 3.0  # SSL target: the untrained network's round-0 monitor accuracy + 3 points


def client_mb(row: dict) -> float | None:
    """Every byte the average client sent or received, in MB: the costs stage's ledger total
    (:data:`MB`, one-shot transfers included), else the rounds' up + down."""
    total = to_float(row.get(MB))
    if total is not None:
        return total
    up, down = to_float(row.get("client_MB_up")), to_float(row.get("client_MB_down"))
    return None if up is None and down is None else (up or 0.0) + (down or 0.0)


# A method's own count of its encoder's bytes, in rows its costs stage wrote before the
# declared column (CLIENT_MB_ENCODER) counted them for every method (the layer-wise family's).
ENCODER_BYTES = "encoder_bytes"


def encoder_mb(row: dict) -> float | None:
    """The MB of the encoder's parameters the average client sent or received: the declared
    column, else the method's own count (:data:`ENCODER_BYTES`) of the same ledger kinds."""
    mb = to_float(row.get(CLIENT_MB_ENCODER.key))
    if mb is not None:
        return mb
    own = to_float(row.get(ENCODER_BYTES))
    return None if own is None else own * 1e-6


def board_values(row: dict, wall: dict[str, float]) -> dict[str, float]:
    """A report row's numbers in the board's columns (blanks left out)."""
    values = {k: to_float(row.get(k)) for k in (*_declared("ssl"), *_declared("personal"))}
    last = [k for k in row if LAST_ROUNDS.match(k)]
    values["personal_last"] = to_float(row[last[0]]) if last else None
    values |= {k: to_float(row.get(k)) for k in cost_columns() if k != MB}
    values |= {MB: client_mb(row), "wall_s": wall.get(row["experiment"])}
    values[CLIENT_MB_ENCODER.key] = encoder_mb(row)
    server = to_float(row.get(simulate.SERVER_FLOPS))
    values[simulate.SERVER_GFLOPS] = None if server is None else server * 1e-9
    values = {k: v for k, v in values.items() if v is not None}
    return values | simulated(values)


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
    out; ``by_seed``: seed -> value), each seed's partition draw (``draws``: seed -> the run's
    partition, a block of the planned questions' model), the runs' experiments, and the last
    rounds its personalised accuracy averages (``last_rounds``)."""
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
            | {"runs": 0, "values": {}, "by_seed": {}, "experiments": [], "last_rounds": set()}
            | {"draws": {}},
        )
        cell["runs"] += 1
        cell["experiments"].append(row["experiment"])
        cell["draws"][seed_of(row["experiment"])] = row.get("partition", "")  # a block's key
        cell["last_rounds"] |= {int(LAST_ROUNDS.match(k)[1]) for k in row if LAST_ROUNDS.match(k)}
        for column, v in values.items():
            cell["values"].setdefault(column, []).append(v)
            cell["by_seed"].setdefault(column, {})[seed_of(row["experiment"])] = v
    return list(out.values())


def count_failures(cell_list: list[dict], failed: Iterable[dict]) -> None:
    """Into each line, the runs of it that stopped with an error (``failed``: the report's
    failures labelled with the line they belong to, :func:`.write.labelled_failures`):
    ``cell["failed"]``, their experiments; a line is reported with its failure rate, never
    as its survivors alone. A failure of a line with no surviving run is left to the note."""
    by_line = {(c["method"], c["encoder"], c["partition"]): c for c in cell_list}
    for cell in cell_list:
        cell.setdefault("failed", [])
    for f in failed:
        cell = by_line.get((f.get("row"), f.get("arch", ""), f.get("column")))
        if cell is not None:
            cell["failed"].append(f["experiment"])


def runs_text(cell: dict) -> str:
    """The runs column: the runs averaged, and how many more stopped with an error."""
    failed = len(cell.get("failed", ()))
    return f"{cell['runs']} (+{failed} failed)" if failed else str(cell["runs"])


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


def line_label(experiment: str, presets, row: str = "method", column: str = "partition"):
    """The board line a preset experiment's runs join: (its report row, column, encoder), as
    the report labels them (:func:`fedssl.reporting.report.table_cell`); None for a name no
    preset has (any more)."""
    from fedssl.methods import registry
    from fedssl.reporting.report import table_cell  # the report's own labels

    try:
        exp = presets.load("experiment", experiment)
    except (KeyError, ParamsError):
        return None
    method, part = registry.get(exp.method.name), presets.load("partition", exp.partition)
    dataset = presets.load("dataset", part.dataset).name
    label, col = table_cell(exp, method, part, dataset, row, column)
    return label, col, method.arch(exp.method)


def pipeline_entry(path: Path, pipeline: str, model: type[BaseModel]):
    """``pipeline``'s entry of the YAML file ``path`` (the board's flags, its questions) as a
    ``model``; None when the file or the entry is absent. A bad entry fails naming the file
    and each field."""
    raw = read_yaml(path).get(pipeline) if path.exists() else None
    if raw is None:
        return None
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        fields = "; ".join(
            f"{pipeline}.{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()
        )
        raise ParamsError(f"{path}: {fields}") from None


# the fields of a run still to come that say which line it joins, per key of a line
_COMING = {"method": ("row", "title"), "encoder": ("arch",), "partition": ("column",)}


def still_to_come(to_come, key: str, name: str, partition: str | None = None) -> bool:
    """Whether a run of a board made part by part, not made yet (``to_come``: labelled by
    :func:`.write.labelled_runs`), would join a line whose ``key`` (method, encoder or
    partition) is ``name``, on ``partition`` where given: a method by its row or its title
    (the row of a run that trains no round)."""
    return any(
        name in (run.get(field) for field in _COMING[key])
        and partition in (None, run.get("column"))
        for run in to_come
    )
