"""The third board's plan: each run's estimated CPU minutes, taken from what the first board's
runs of the same line measured (``results/reports/board/stage_runs.json``: every stage's wall
seconds, one thread each), scaled where the run differs from that line's: the images a round
trains (the clients sampled and the partition's size) and the fine-tuning's epochs. The CPU
hours of each part are the sum over its runs (the 2-core machine runs two stages at once, so
its wall hours are about half).

A board is made over many sessions, and a session's machine keeps nothing but what was
committed: a run whose stages finish in one session lands (its metrics committed), one cut off
by the session's end starts again next time. So :func:`left` lists each part's runs that have
not landed yet in batches of whole runs that fit a session's CPU hours, as ``fedssl run``
commands (``--keep-going``: a run that diverges stops only itself); after each, the part's
report (``python -m stages.report PART --reuse-committed --partial``) is committed: it keeps the
rows of the runs made so far and the runs that stopped with an error. Its committed metrics are
all a tuning part's run needs (the sweep reads them); a run a board part reports has landed only
once a committed report also holds its row (its steps' outputs do not outlive the session), so
one whose report was never committed runs again, under the first part that reports it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from fedssl.params import federation_of
from fedssl.plan.dag import Dag
from fedssl.presets import Presets
from fedssl.reporting.board.budget import line_of, round_step_names
from fedssl.reporting.formatting import markdown_table

MEASURED_RUNS = Path("results/reports/board/stage_runs.json")
MEASURED_PIPELINE = "board"  # the first board: its experiments' names start with board_
REPORTS = Path("results/reports")  # where each board keeps its kept run records
UNRECORDED_MIN = 1.0  # an untrained reference's probes, where no stage of its own was recorded


def origin(name: str, presets: Presets) -> str | None:
    """The first board's run a grid member descends from, following each grid's ``extends``
    (its placeholders filled) until a member of the measured pipeline."""
    measured = set(presets.pipeline_experiments(MEASURED_PIPELINE))
    while name not in measured:
        name = presets.base_of("experiment", name)
        if name is None:
            return None
    return name


def measured_runs(runs_file: Path = MEASURED_RUNS) -> dict[str, dict[str, float]]:
    """Per first-board experiment: the wall seconds of its stages, by stage kind."""
    out: dict[str, dict[str, float]] = {}
    for stage, record in json.loads(runs_file.read_text()).items():
        kind, _, experiment = stage.partition("__")
        out.setdefault(experiment, {})[kind] = record["wall_seconds"]
    return out


def images_a_round(exp, presets: Presets) -> float:
    """The training images one round touches: the clients' share of the partition."""
    part = presets.load("partition", exp.partition)
    block = federation_of(exp.method)
    fraction = block.client_fraction if block is not None else 1.0
    return fraction * (part.subset or 0)


def run_minutes(name: str, presets: Presets, measured: dict, rounds_kinds: set[str]) -> float:
    """A run's estimated CPU minutes: the mean over its first-board line's runs (the origin's
    seeds and partitions) of their stages' seconds, the round stages scaled by the images a
    round touches and the fine-tuning by its epochs."""
    base = origin(name, presets)
    if base is None:
        raise KeyError(f"{name}: no run of the first board to estimate it from")
    members = presets.grid_members("experiment")
    line = line_of(base, members)  # its grid and variant: board_supervised:fedavg
    runs = [k for e, k in measured.items() if line_of(e, members) == line]
    if not runs:  # an untrained reference whose stages another run of the board owned
        return UNRECORDED_MIN
    exp, was = presets.load("experiment", name), presets.load("experiment", base)
    ratio = images_a_round(exp, presets) / images_a_round(was, presets)
    scale = dict.fromkeys(rounds_kinds, ratio)
    if exp.finetune is not None and was.finetune is not None:
        scale["finetune"] = exp.finetune.epochs / was.finetune.epochs
    return statistics.mean(sum(s * scale.get(k, 1.0) for k, s in r.items()) for r in runs) / 60


def board_minutes(
    board: str, presets: Presets, rounds_kinds: set[str], reports: Path = REPORTS
) -> dict[str, float]:
    """The CPU minutes the board's own runs took, per line (:func:`line_of`): from the run
    records its rendering keeps (``results/reports/<board>/stage_runs.json``), each run's
    stages summed, a line's runs averaged; a run whose record lacks a rounds stage (cut off,
    or its records not kept) is left out. What :func:`left` trusts before the first board's
    scaled estimate, which misses costs that do not scale with a round's images (at 100
    clients, evaluating every client each round)."""
    path = reports / board / "stage_runs.json"
    members, by_line = presets.grid_members("experiment"), {}
    for exp, kinds in measured_runs(path).items() if path.exists() else ():
        if rounds_kinds & kinds.keys():
            by_line.setdefault(line_of(exp, members), []).append(sum(kinds.values()) / 60)
    return {line: statistics.mean(minutes) for line, minutes in by_line.items()}


def parts_of(board: str, presets: Presets) -> list[str]:
    """A board's parts: the pipelines named ``<board>_*``, in the order params/pipelines.yaml
    lists them (the order they run)."""
    return [p for p in presets.pipelines().pipelines if p.startswith(f"{board}_")]


def plan(parts: list[str], presets: Presets | None = None) -> list[dict]:
    """A line per part and grid: its runs and estimated CPU hours (each run once: a run two
    parts list is planned in the first)."""
    presets = presets or Presets()
    measured = measured_runs()
    rounds_kinds = round_step_names(MEASURED_PIPELINE)
    members, seen, rows = presets.grid_members("experiment"), set(), []
    for part in parts:
        by_grid: dict[str, list[float]] = {}
        for name in presets.pipeline_experiments(part):
            if name not in seen:
                seen.add(name)
                grid = members.get(name, (name, {}))[0]
                by_grid.setdefault(grid, []).append(
                    run_minutes(name, presets, measured, rounds_kinds)
                )
        for grid, minutes in by_grid.items():
            mean, hours = statistics.mean(minutes), sum(minutes) / 60
            rows.append(
                {
                    "part": part,
                    "grid": grid,
                    "runs": len(minutes),
                    "min_per_run": mean,
                    "cpu_h": hours,
                }
            )
    return rows


def plan_markdown(rows: list[dict]) -> str:
    """The plan as a table, the parts' CPU hours in its caption."""
    hours: dict[str, float] = {}
    for r in rows:
        hours[r["part"]] = hours.get(r["part"], 0.0) + r["cpu_h"]
    table = [
        [r["part"], r["grid"], str(r["runs"]), f"{r['min_per_run']:.1f}", f"{r['cpu_h']:.1f}"]
        for r in rows
    ]
    caption = (
        f"The third board's plan: CPU minutes a run as the first board's runs of the same "
        f"line took ({MEASURED_RUNS}), scaled by the images a round trains and the "
        f"fine-tuning's epochs; CPU hours per part: "
        + ", ".join(f"{p} {h:.1f}" for p, h in hours.items())
        + f"; in all {sum(hours.values()):.1f} CPU hours"
    )
    return markdown_table(["part", "grid", "runs", "CPU min / run", "CPU h"], table, caption)


def landed(name: str, dag: Dag) -> bool:
    """Whether a run's results are committed: every metrics file of its own stages exists."""
    own = [dag.stages[s] for s in dag.of_experiment[name] if s.endswith(f"__{name}")]
    return all(Path(m).exists() for s in own for m in s.metrics)


def is_tuning(part: str) -> bool:
    """A board's tuning parts are its pipelines ``<board>_tune*`` (see :mod:`.tuning`)."""
    return part.split("_", 1)[-1].startswith("tune")


def rowless(parts: list[str], presets: Presets) -> set[str]:
    """The runs a board part (not a tuning part) reports that no committed report holds a row
    of, nor lists as stopped with an error: their row must be made from their steps' outputs,
    so they must run again."""
    from fedssl.reporting.report import committed_failures, committed_rows

    stopped = {n for p in parts for n in committed_failures(p)}
    reported = {n for p in parts if not is_tuning(p) for n in presets.pipeline_experiments(p)}
    return reported - committed_rows().keys() - stopped


def batches(runs: list[tuple[str, float]], cpu_hours: float) -> list[list[tuple[str, float]]]:
    """Runs (name, CPU minutes) in their order, cut into consecutive batches of at most
    ``cpu_hours`` each (a run longer than that alone)."""
    out: list[list[tuple[str, float]]] = []
    total = float("inf")
    for run in runs:
        if total + run[1] > cpu_hours * 60:
            out.append([])
            total = 0.0
        out[-1].append(run)
        total += run[1]
    return out


def estimator(board: str, presets: Presets):
    """A run's estimated CPU minutes: as the board's own runs of its line took
    (:func:`board_minutes`), else :func:`run_minutes`."""
    measured, rounds_kinds = measured_runs(), round_step_names(MEASURED_PIPELINE)
    own = board_minutes(board, presets, rounds_kinds)
    members = presets.grid_members("experiment")

    def minutes(name: str) -> float:
        found = own.get(line_of(name, members))
        return found or run_minutes(name, presets, measured, rounds_kinds)

    return minutes


def left(parts: list[str], cpu_hours: float, presets: Presets | None = None) -> str:
    """Per part, the runs not landed yet with their estimated CPU hours (as the board's own
    runs of the line took, :func:`board_minutes`, else :func:`run_minutes`), as ``fedssl run``
    commands of at most ``cpu_hours`` each (a 2-core machine runs two stages at once: a batch of
    H CPU hours takes about H / 2 hours). A run the part's committed report lists as stopped
    with an error (a diverged loss) is a result, not left: it is counted apart. A run a board
    part reports without a committed row (:func:`rowless`) is left, under that part, even where
    a tuning part listed it first and its metrics landed."""
    from fedssl.reporting.report import committed_failures

    presets = presets or Presets()
    minutes = estimator(parts[0].split("_", 1)[0], presets)
    no_row = rowless(parts, presets)
    lines, seen = [], set()
    for part in parts:
        dag, failed = Dag(part, presets=presets), committed_failures(part)
        names = [n for n in dag.experiments if n not in seen]
        deferred = {n for n in names if is_tuning(part) and n in no_row}
        seen |= set(names) - deferred
        todo = [
            (n, minutes(n))
            for n in names
            if n not in deferred and n not in failed and (not landed(n, dag) or n in no_row)
        ]
        hours = sum(m for _, m in todo) / 60
        stopped = sum(n in failed for n in names)
        notes = [f"{stopped} stopped with an error, as its report says"] if stopped else []
        if deferred:
            notes.append(f"{len(deferred)} left under the parts that report them: no committed "
                         "report holds their rows")  # fmt: skip
        lines.append(
            f"{part}: {len(todo)} of {len(names)} runs left, {hours:.1f} CPU h"
            + (f" ({'; '.join(notes)})" if notes else "")
        )
        for i, batch in enumerate(batches(todo, cpu_hours), 1):
            cpu = sum(m for _, m in batch) / 60
            runs = " ".join(n for n, _ in batch)
            lines.append(
                f"  batch {i} ({len(batch)} runs, {cpu:.1f} CPU h): "
                f"fedssl run {part} {runs} --keep-going"
            )
    return "\n".join(lines)


def spent(board: str, presets: Presets | None = None, reports: Path = REPORTS) -> str:
    """Per part, the CPU hours its runs made so far took: their own stages' seconds in the
    board's kept run records (``<reports>/<board>/stage_runs.json``; one thread a stage, so
    wall = CPU; a run two parts list counts in the first; stages runs share, such as the
    partitions, are left out). A run made without a kept record (a tuning run no board part
    reports: no rendering kept its stages) is counted apart, at :func:`estimator`'s figure."""
    from fedssl.reporting.report import committed_failures

    presets = presets or Presets()
    path = reports / board / "stage_runs.json"
    recorded = measured_runs(path) if path.exists() else {}
    minutes, rows, seen = estimator(board, presets), [], set()
    for part in parts_of(board, presets):
        dag, failed = Dag(part, presets=presets), committed_failures(part)
        made = [n for n in dag.experiments if n not in seen and (n in failed or landed(n, dag))]
        seen |= set(made)
        kept = [n for n in made if n in recorded]
        measured = sum(sum(recorded[n].values()) for n in kept) / 3600
        guessed = sum(minutes(n) for n in made if n not in recorded) / 60
        rows.append([part, len(made), len(kept), measured, guessed])
    total = ["in all", *(sum(r[i] for r in rows) for i in range(1, 5))]
    return markdown_table(
        ["part", "runs made", "of them recorded", "CPU h recorded", "CPU h estimated, the rest"],
        [[r[0], str(r[1]), str(r[2]), f"{r[3]:.1f}", f"{r[4]:.1f}"] for r in [*rows, total]],
        f"CPU hours the board's runs took so far, from {path}",
    )
