"""The benchmark board: every method of a pipeline side by side, accuracy beside its cost.

It branches on no method. It reads what the pipeline's report stage committed (its rows:
the probes' and the personalised evaluation's accuracies, the per-client traffic and the
``costs`` stage's columns) and the run records of the stages (``artifacts/.runs/``: wall
time, the machine), groups the runs that differ only in their seed, and writes into the
report's folder:

- ``board.md`` (and ``board_tables.md``, its tables alone, for the README): one table per
  evaluation (self-supervised methods by their probes,
  personalised methods by each client's model on its own test split), a line per method,
  encoder and partition, mean ± SD over seeds, the costs beside;
- ``board.json``: the same numbers, a DVC metric (``dvc metrics diff`` between two boards);
- ``stage_runs.json``: the run records it read (wall seconds, machine), which the next
  rendering falls back on, so a board made part by part keeps every part's wall time;
- ``board_accuracy_vs_MB.png`` and ``board_accuracy_vs_GFLOPs.png`` (the per-round curves are
  the report's ``curves.png``).

The budget rule that sets each method's rounds (:func:`rounds_within`) lives here too, with
the table of per-round times it was applied to (``python -m fedssl.board budget``).

``python -m fedssl.board render PIPELINE`` (``make benchmark`` runs it after the pipeline);
``python -m fedssl.board readme`` refills the README's ``<!-- board: PIPELINE -->`` block.
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

from fedssl import evaluations
from fedssl.plan.layout import owner_of, report_dir
from fedssl.report_format import markdown_table, mean_sd, number, save_figure, sd_note, to_float

SD = "sample"
# The stages' run records the board keeps beside itself (committed, so that the wall times
# of runs made by an earlier session survive a rendering elsewhere): of each, its wall time
# and what the caption says of its machine (:func:`hardware`), one stage a line.
RUNS_FILE = "stage_runs.json"
MACHINE_KEYS = ("host", "cpu_count", "gpu", "torch", "torch_threads", "FEDSSL_THREADS")
# The evaluations the board has a table for: name -> (heading, its accuracy columns: row key
# -> header, the metrics declared for it in fedssl.evaluations). A run belongs to the first
# evaluation whose first column it has.
EVALUATIONS = {
    name: (heading, {m.key: m.label for m in evaluations.metrics() if m.board == name})
    for name, heading in {
        "ssl": "Self-supervised and supervised encoders, probed (top-1 %)",
        "personal": "Personalised and clustered methods (top-1 %, each client's model on its "
        "own test split)",
    }.items()
}
# The costs beside the accuracies: row key -> header. Per client, averaged over clients, then
# over seeds. `wall_s` comes from the run records, the others from the report's rows.
COSTS = {
    "client_MB_up": "MB up / client",
    "client_MB_down": "MB down / client",
    "beta_GFLOPs": "GFLOPs / client",
    "peak_step_MB": "peak MB / client",
    "rounds": "rounds",
    "wall_s": "wall s",
}


# ------------------------------------------------------------------ the cells
def evaluation_of(row: dict) -> str | None:
    """The board table a run belongs to (None: it has none of the board's accuracies)."""
    for name, (_, columns) in EVALUATIONS.items():
        if to_float(row.get(next(iter(columns)))) is not None:
            return name
    return None


def cells(rows: Iterable[dict], wall: dict[str, float]) -> list[dict]:
    """The board's lines: the runs grouped by evaluation, method (the report's row label),
    encoder and partition (its column), in the order they first appear. Each line holds
    the runs' values of every accuracy and cost column (a list per column, missing ones left
    out), ``wall_s`` from ``wall`` (experiment -> seconds) and the number of runs."""
    out: dict[tuple, dict] = {}
    for row in rows:
        evaluation = evaluation_of(row)
        if evaluation is None:
            continue
        key = (evaluation, row["row"], row.get("arch", ""), row["column"])
        cell = out.setdefault(
            key,
            {"evaluation": evaluation, "method": key[1], "encoder": key[2], "partition": key[3]}
            | {"runs": 0, "values": {}},
        )
        cell["runs"] += 1
        values = {**row, "wall_s": wall.get(row["experiment"])}
        for column in [*EVALUATIONS[evaluation][1], *COSTS]:
            v = to_float(values.get(column))
            if v is not None:
                cell["values"].setdefault(column, []).append(v)
    return list(out.values())


def cell_key(cell: dict) -> str:
    """A line's name in board.json: method, encoder and partition."""
    return " | ".join(p for p in (cell["method"], cell["encoder"], cell["partition"]) if p)


def metrics(cell_list: list[dict]) -> dict:
    """board.json's numbers: per line, the mean and SD of every column (SD only over two
    runs or more), and the runs."""
    spread = statistics.stdev if SD == "sample" else statistics.pstdev
    out = {}
    for cell in cell_list:
        numbers = {"runs": cell["runs"]}
        for column, values in cell["values"].items():
            numbers[f"{column}_mean"] = round(statistics.mean(values), 4)
            if len(values) > 1:
                numbers[f"{column}_sd"] = round(spread(values), 4)
        out[cell_key(cell)] = numbers
    return out


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


def table(evaluation: str, cell_list: list[dict], machine: str) -> str:
    """One evaluation's table: a line per method, encoder and partition; accuracies as
    mean ± SD over seeds, the costs as means."""
    heading, accuracies = EVALUATIONS[evaluation]
    mine = [c for c in cell_list if c["evaluation"] == evaluation]
    shown = [c for c in accuracies if any(c in cell["values"] for cell in mine)]
    costs = [c for c in COSTS if any(c in cell["values"] for cell in mine)]
    lines = []
    for cell in mine:
        v = cell["values"]
        lines.append(
            [cell["method"], cell["encoder"], cell["partition"], str(cell["runs"])]
            + [mean_sd(v.get(c, []), SD, ".1f") for c in shown]
            + [number(statistics.mean(v[c]), ".4g") if c in v else "" for c in costs]
        )
    caption = (
        f"{heading}: {sd_note(SD, 'seeds')} (n = the runs column); costs are means per "
        f"client and run (blank: the method has no costs stage); wall s = the run's own "
        f"stages (a stage shared by several runs counts in each); hardware: {machine}"
    )
    header = ["method", "encoder", "partition", "runs"]
    return markdown_table(
        header + [accuracies[c] for c in shown] + [COSTS[c] for c in costs], lines, caption
    )


def tables_text(
    cell_list: list[dict],
    machine: str,
    total_wall: float,
    pending: list[str] = (),
    failed: list[dict] = (),
) -> str:
    """The board's tables and its total wall time (``board_tables.md``, which the README's
    block copies); a board made part by part says how many runs are still to come, and a
    run that stopped with an error (a diverged loss) is named with it: its line has one run
    fewer, and the reader should know why."""
    parts = []
    if pending:
        parts.append(f"*Partial board: {len(pending)} runs not made yet (named in report.md).*\n")
    if failed:
        named = "; ".join(f"`{f['experiment']}` ({f['stage']}: {f['error']})" for f in failed)
        parts.append(
            f"*{len(failed)} run(s) stopped with an error and are left out of their lines "
            f"(the runs column counts the others): {named}.*\n"
        )
    parts += [
        f"**{heading}**\n\n{table(evaluation, cell_list, machine)}\n"
        for evaluation, (heading, _) in EVALUATIONS.items()
        if any(c["evaluation"] == evaluation for c in cell_list)
    ]
    return (
        "\n".join(parts)
        + f"\nTotal wall time of the pipeline's stages: {total_wall / 3600:.2f} h.\n"
    )


def render(pipeline: str, tables: str) -> str:
    """board.md's text: the tables and the figures."""
    return (
        f"# Benchmark board: pipeline `{pipeline}`\n\n{tables}\n"
        "![accuracy against communication](board_accuracy_vs_MB.png)\n"
        "![accuracy against client FLOPs](board_accuracy_vs_GFLOPs.png)\n"
        "![per-round curves](curves.png)\n"
    )


def plot(cell_list: list[dict], costs: tuple[str, ...], label: str, path: Path) -> None:
    """Accuracy (the line's first accuracy column: linear probe or personalised) against a
    cost (the sum of the means of ``costs``), one point per line with its SD over seeds as
    the error bar, a panel per evaluation and a marker per partition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evaluations = [e for e in EVALUATIONS if any(c["evaluation"] == e for c in cell_list)]
    fig, axes = plt.subplots(
        1, max(1, len(evaluations)), figsize=(7 * max(1, len(evaluations)), 5), squeeze=False
    )
    partitions = list(dict.fromkeys(c["partition"] for c in cell_list))
    markers = dict(zip(partitions, "osD^v<>p*"))
    for ax, evaluation in zip(axes[0], evaluations):
        heading, accuracies = EVALUATIONS[evaluation]
        accuracy = next(iter(accuracies))
        for cell in (c for c in cell_list if c["evaluation"] == evaluation):
            ys = cell["values"].get(accuracy)
            xs = [statistics.mean(cell["values"][c]) for c in costs if c in cell["values"]]
            if not ys or len(xs) < len(costs):
                continue
            sd = statistics.stdev(ys) if len(ys) > 1 else 0.0
            ax.errorbar(
                sum(xs),
                statistics.mean(ys),
                yerr=sd,
                marker=markers.get(cell["partition"], "o"),
                capsize=3,
                linestyle="none",
            )
            ax.annotate(cell["method"], (sum(xs), statistics.mean(ys)), fontsize=6)
        ax.set_xscale("symlog")
        ax.set_xlabel(label)
        ax.set_ylabel(f"{accuracies[accuracy]} top-1 % ({sd_note(SD, 'seeds')})")
        ax.set_title(heading, fontsize=9)
        ax.grid(alpha=0.3)
    handles = [
        plt.Line2D([], [], marker=m, linestyle="none", color="k", label=p)
        for p, m in markers.items()
    ]
    axes[0][0].legend(handles=handles, fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=90)
    plt.close(fig)


# ------------------------------------------------------------------ run records
def run_records(dag, kept: dict | None = None) -> tuple[dict[str, float], list[dict], float]:
    """From the stages' run records (:func:`fedssl.stage.run_record`): wall seconds per
    experiment (its own stages, shared ones counted in each), every record, and the
    pipeline's total (each stage once). ``kept`` (stage -> record, from the board's
    committed :data:`RUNS_FILE`) fills in the stages this workspace has not run: a board
    made over several sessions keeps the wall times of the runs an earlier one made."""
    from fedssl.stage import run_record

    records = {name: r for name in dag.stages if (r := run_record(name) or (kept or {}).get(name))}
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
    folder: Path, pipeline: str, rows: list[dict], wall, records, total, pending=(), failed=()
) -> dict:
    """board.md, board.json and the two figures in ``folder``; returns board.json's content."""
    cell_list = cells(rows, wall)
    tables = tables_text(cell_list, hardware(records), total, pending, failed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "board_tables.md").write_text(tables)
    (folder / "board.md").write_text(render(pipeline, tables))
    board = {"total_wall_hours": round(total / 3600, 3), "lines": metrics(cell_list)}
    (folder / "board.json").write_text(json.dumps(board, indent=1, ensure_ascii=False) + "\n")
    write_kept_records(folder, records)
    mb = ("client_MB_up", "client_MB_down")
    plot(cell_list, mb, "MB up + down / client", folder / "board_accuracy_vs_MB.png")
    plot(cell_list, ("beta_GFLOPs",), COSTS["beta_GFLOPs"], folder / "board_accuracy_vs_GFLOPs.png")
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
    """The budget table as the README shows it, with the board's estimated total."""
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


# ------------------------------------------------------------------ README
README = Path("README.md")
_BLOCK = re.compile(r"(<!-- board: (\w+) -->\n)(.*?)(<!-- /board -->)", re.S)


def readme_text(text: str, results: Path = Path("results/reports")) -> str:
    """``text`` with every ``<!-- board: PIPELINE -->`` block refilled from that pipeline's
    ``board_tables.md``; a block whose board has not run yet stays as it is."""

    def fill(m: re.Match) -> str:
        path = results / m.group(2) / "board_tables.md"
        return m.group(1) + path.read_text() + m.group(4) if path.exists() else m.group(0)

    return _BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedssl.board")
    sub = ap.add_subparsers(dest="command", required=True)
    draw = sub.add_parser("render", help="write the board from a pipeline's committed report")
    draw.add_argument("pipeline", nargs="?", default="benchmark")
    sub.add_parser("readme", help="refill the README's board blocks from board_tables.md")
    sub.add_parser("budget", help="the budget rule applied to benchmarks/board_budget.tsv")
    args = ap.parse_args(argv)
    if args.command == "readme":
        README.write_text(readme_text(README.read_text()))
        return 0
    if args.command == "budget":
        print(budget_markdown(budget_table()))
        return 0
    from fedssl.plan.dag import Dag
    from fedssl.report import load_saved

    folder = Path(report_dir(args.pipeline))
    try:
        saved = load_saved(folder)
    except (FileNotFoundError, KeyError) as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 1
    wall, records, total = run_records(Dag(args.pipeline), kept_records(folder))
    write_board(
        folder,
        args.pipeline,
        saved["rows"],
        wall,
        records,
        total,
        saved.get("pending", []),
        saved.get("failed", []),
    )
    print(f"wrote {folder}/board.md, board.json and its figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
