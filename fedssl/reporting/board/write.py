"""Writing a board (``python -m fedssl.reporting.board render PIPELINE``): the stages' run
records, the files of the board's folder, the docs' ``<!-- board: -->`` blocks, the command line."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from fedssl.plan.layout import owner_of, report_dir
from fedssl.reporting.board.advise import planned_advice
from fedssl.reporting.board.budget import budget_markdown, budget_table, plan_markdown, plan_table
from fedssl.reporting.board.cells import (
    MACHINE_KEYS,
    MB,
    RUNS_FILE,
    cells,
    cost_columns,
    count_failures,
    line_label,
    rounds_to_target,
)
from fedssl.reporting.board.figures import plot, plot_over_run
from fedssl.reporting.board.flags import DOCS_FROM_REPORT, FLAGS_FILE, flag_lines, load_flags
from fedssl.reporting.board.imagewise import record_files
from fedssl.reporting.board.questions import (
    QUESTIONS_FILE,
    ask,
    line_families,
    load_questions,
    questions_text,
)
from fedssl.reporting.board.revisit import revisited
from fedssl.reporting.board.significance import compare_lines, metrics
from fedssl.reporting.board.simulate import TOTAL
from fedssl.reporting.board.steps import with_local_steps
from fedssl.reporting.board.tables import FIGURES, hardware, render, tables_text
from fedssl.reporting.board.tuning import mark_tuning
from fedssl.stage.record import ParamsError


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


def labelled_runs(runs: list[dict], dag) -> list[dict]:
    """Runs the report has no row for (failed, or still to come: each a dict with its
    ``experiment``) with the line each would join (the report's row, column and encoder, as
    its rows have them, and its ``title``, the row of a run that trains no round where others
    share its label: :func:`fedssl.reporting.report.untrained_apart`); a run no preset names
    any more is kept as it is (no line)."""
    from fedssl.presets import Presets

    presets, out = Presets(), []
    for f in runs:
        line = line_label(f["experiment"], presets, dag.row, dag.column)
        if line is not None:
            title = presets.load("experiment", f["experiment"]).title
            f = f | dict(zip(("row", "column", "arch"), line), title=title)
        out.append(f)
    return out


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


def draw_figures(folder: Path, cell_list: list[dict], logs: dict, plan) -> list[str]:
    """The board's figures in ``folder`` (accuracy against MB and GFLOPs, the accuracy over
    the run per question family); returns their file names."""
    headers = cost_columns()
    plot(cell_list, MB, headers[MB], folder / "board_accuracy_vs_MB.png")
    # the client's FLOPs and the server's on its behalf: a split line's server work counts
    plot(cell_list, TOTAL, headers[TOTAL], folder / "board_accuracy_vs_GFLOPs.png")
    drawn = [f for f in FIGURES if f.startswith("board_accuracy_vs")]
    for stale in folder.glob("board_over_run_*.png"):
        stale.unlink()  # a family no longer drawn leaves no figure behind
    return drawn + plot_over_run(cell_list, logs, folder, line_families(plan))


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
    questions_file: Path = QUESTIONS_FILE,
    image_records: dict[str, dict[str, Path]] | None = None,
    to_come: list[dict] = (),
) -> dict:
    """board.md, board.json and the figures in ``folder`` (``logs``: experiment -> its round
    log's rows, for the accuracy over the run; ``flags_file``: :data:`FLAGS_FILE`, the
    pipeline's entry flags its lines; ``questions_file``: its planned questions, answered
    into ``board_questions.md`` and board.json, and into the lines' vs reference, with the
    test images where the runs have per-image records, ``image_records``:
    :func:`.imagewise.record_files`; ``to_come``: the ``pending`` runs labelled with their
    lines, :func:`labelled_runs`, whose lines the flags may name before they are made);
    returns board.json's content."""
    cell_list = cells(rows, wall)
    count_failures(cell_list, failed)
    compare_lines(cell_list)
    plan = load_questions(pipeline, questions_file)
    where = f"{questions_file}: {pipeline}"
    answers = ask(cell_list, plan, where, image_records, to_come)
    flag_lines(cell_list, load_flags(pipeline, flags_file), flags_file, to_come)
    mark_tuning(cell_list, folder)
    rounds_to_target(cell_list, logs or {})
    asked = questions_text(answers, plan)
    asked += revisited(answers, plan, folder.parent, where) if asked else ""
    advice = planned_advice(rows, plan, len(pending))  # the page opens with it
    tables = advice + tables_text(cell_list, hardware(records), total, pending, failed) + asked
    # board.md sits in the report's folder: its links reach the docs' results pages
    page = tables_text(cell_list, hardware(records), total, pending, failed, DOCS_FROM_REPORT)
    page = advice + page + asked
    folder.mkdir(parents=True, exist_ok=True)
    drawn = draw_figures(folder, cell_list, logs or {}, plan)
    (folder / "board_tables.md").write_text(tables)
    (folder / "board.md").write_text(render(pipeline, page, [*drawn, "curves.png"]))
    board = {"total_wall_hours": round(total / 3600, 3), "lines": metrics(cell_list)}
    if answers:
        board["questions"] = answers
        (folder / "board_questions.md").write_text(asked)
    (folder / "board.json").write_text(json.dumps(board, indent=1, ensure_ascii=False) + "\n")
    write_kept_records(folder, records)
    return board


_BLOCK = re.compile(r"(<!-- board: (\w+) -->\n)(.*?)(<!-- /board -->)", re.S)


def fill_blocks(text: str, results: Path = Path("results/reports")) -> str:
    """``text`` with every ``<!-- board: PIPELINE -->`` block refilled from that pipeline's
    ``board_tables.md``; a block whose board has not run yet stays as it is."""

    def fill(m: re.Match) -> str:
        path = results / m.group(2) / "board_tables.md"
        return m.group(1) + path.read_text() + m.group(4) if path.exists() else m.group(0)

    return _BLOCK.sub(fill, text)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="fedssl board")
    sub = ap.add_subparsers(dest="command", required=True)
    draw = sub.add_parser("render", help="write the board from a pipeline's committed report")
    draw.add_argument("pipeline", nargs="?", default="benchmark")
    sub.add_parser("budget", help="the budget rule applied to benchmarks/board_budget.tsv")
    plan_ = sub.add_parser("plan", help="a board's parts and their estimated CPU hours")
    plan_.add_argument(
        "board", nargs="?", help="a board whose parts are pipelines <board>_* (none: the second)"
    )
    plan_.add_argument(
        "--left",
        type=float,
        metavar="CPU_HOURS",
        help="instead: each part's runs whose results are not committed yet, as fedssl run "
        "commands of at most CPU_HOURS each (what one session can finish)",
    )
    plan_.add_argument(
        "--spent",
        action="store_true",
        help="instead: the CPU hours each part's runs made so far took, as their kept run "
        "records measured",
    )
    tune = sub.add_parser("tune", help="a board's learning rates chosen on validation")
    tune.add_argument("board", help="a board whose tuning parts are pipelines <board>_tune*")
    return ap.parse_args(argv)


def _planning(args: argparse.Namespace) -> str:
    """What the budget, plan and tune commands print."""
    if args.command == "tune":
        import fedssl.reporting.board.tuning as tuning

        return f"wrote {tuning.write_tuning(args.board)}"
    if args.command == "budget":
        return budget_markdown(budget_table())
    if not args.board:
        return plan_markdown(plan_table())
    import fedssl.reporting.board.plan as plan
    from fedssl.presets import Presets

    presets = Presets()
    if args.spent:
        return plan.spent(args.board, presets)
    if args.left:
        return plan.left(plan.parts_of(args.board, presets), args.left, presets)
    return plan.plan_markdown(plan.plan(plan.parts_of(args.board, presets), presets))


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    if args.command != "render":
        print(_planning(args))
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
    pending = saved.get("pending", [])
    try:
        write_board(
            folder,
            args.pipeline,
            with_local_steps(saved["rows"]),
            wall,
            records,
            total,
            pending,
            labelled_runs(saved.get("failed", []), dag),
            {name: read_round_log(paths) for name, paths in round_logs(dag, pending).items()},
            image_records=record_files(dag),
            to_come=labelled_runs([{"experiment": e} for e in pending], dag),
        )
    except ParamsError as e:  # the flags or questions file: its message names the field
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {folder}/board.md, board.json and its figures")
    return 0
