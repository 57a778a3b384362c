"""Stage: the report across a pipeline's experiments (one row per experiment, rendered by
:func:`fedssl.reporting.report.write_report` into ``results/reports/<pipeline>/``, committed:
Markdown, CSV and JSON), its methods' figures and the round curves, plus the partition heat-maps.

Run by hand with ``--reuse-committed``, it takes the rows of experiments whose step outputs the
workspace lacks from the committed reports that hold them (checked to be the same experiment,
named in the report), so a pipeline sharing runs with a committed one need not rerun them, and
lists the runs whose stage stopped with an error (their Snakemake log's last error line). With
``--partial`` as well, experiments neither run here nor committed are listed as not run yet
instead of failing: a long pipeline (the benchmark board) made over several sessions, each
committing its report, the next reusing those rows."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from types import SimpleNamespace

from fedssl.params import setting
from fedssl.plan.layout import ReportRow, owner_of, report_dir, results_dir
from fedssl.reporting.report import (
    committed_failures,
    committed_rows,
    curve_labels,
    experiment_row,
    failed_run,
    plot_curves,
    reused_row,
    round_logs,
    table_cell,
    untrained_apart,
    write_report,
)
from fedssl.stage.context import StageContext, main_guard


class PipelinePlan:
    """The pipeline's plan as the report's record holds it (experiments, their stages, the
    pivot), with the DAG's names for them."""

    def __init__(self, plan: dict):
        self.row, self.column = plan["row"], plan["column"]
        self.of_experiment = plan["experiments"]
        self.experiments = plan["order"]  # the pipeline's order: the report's rows
        self.stages = {
            name: SimpleNamespace(name=name, **stage) for name, stage in plan["stages"].items()
        }


def made_here(stages) -> bool:
    """Whether this workspace holds the run: every stage's record and metrics (a run trained but
    not yet evaluated is not made, so a board made part by part is reported between stages)."""
    return all(
        (Path(s.out) / "meta.json").exists() and all(Path(m).exists() for m in s.metrics)
        for s in stages
    )


def run(argv):
    ap = argparse.ArgumentParser(prog="python -m stages.report")
    ap.add_argument("pipeline", help="a pipeline of params/pipelines.yaml")
    ap.add_argument(
        "--reuse-committed",
        action="store_true",
        help="take the rows of experiments whose step outputs this workspace lacks from the "
        "committed reports that hold them, and list runs that stopped with an error (the "
        "report says which), instead of failing",
    )
    ap.add_argument(
        "--partial",
        action="store_true",
        help="with --reuse-committed: leave out the experiments that have neither outputs here "
        "nor a committed row, and list them as not run yet (a pipeline made over several "
        "sessions, part by part)",
    )
    args = ap.parse_args(argv)
    if args.partial and not args.reuse_committed:
        ap.error("--partial goes with --reuse-committed")
    pipeline = args.pipeline
    ctx = StageContext("report", pipeline)
    dag, presets = PipelinePlan(ctx.record["pipeline"]), ctx.presets
    from fedssl.methods import registry

    committed = committed_rows(pipeline) if args.reuse_committed else {}
    stopped_before = committed_failures(pipeline) if args.reuse_committed else {}
    rows, failed, pending, partitions, methods, swept = [], [], [], [], {}, []
    titles_of_row: dict[str, set[str]] = {}  # for untrained_apart
    for name in dag.experiments:
        exp = presets.load("experiment", name)
        method = methods.setdefault(exp.method.name, registry.get(exp.method.name))
        part = presets.load("partition", exp.partition)
        stages = [dag.stages[s] for s in dag.of_experiment[name]]
        steps = [
            Path(s.out)
            for s in stages
            if s.kind in {st.name for st in method.steps_for(exp.method)}
        ]
        row, column = table_cell(
            exp, method, part, presets.load("dataset", part.dataset).name, dag.row, dag.column
        )
        titles_of_row.setdefault(row, set()).add(exp.title)
        if args.reuse_committed and not made_here(stages):
            stopped = failed_run(name, [s.name for s in stages]) or stopped_before.get(name)
            if stopped and name not in committed:
                # with its cell: it has no row, and its curve belongs in its line's panel
                cell = {"row": row, "column": column, "arch": method.arch(exp.method)}
                failed.append({**stopped, **cell})
                continue
            if args.partial and name not in committed:
                pending.append(name)
                continue
            now = {"title": exp.title, "partition": exp.partition, "method": method.name}
            now.update(arch=method.arch(exp.method), row=row, column=column)
            rows.append(reused_row(name, now, committed))
        else:
            costs = next((Path(s.out) for s in stages if s.kind == "costs"), None)
            metrics = [Path(m) for s in stages for m in s.metrics]  # probes, fine-tuning, ...
            rows.append(
                ReportRow(
                    {
                        **experiment_row(name, exp, method, steps, metrics, costs),
                        "row": row,
                        "column": column,
                    },
                    {s.kind: results_dir(owner_of(s.out)) for s in stages},
                )
            )
        partitions += [exp.partition] if exp.partition not in partitions else []
        swept.append(setting(exp, dag.column) if dag.column != "partition" else None)
    rows = untrained_apart(in_column_order(rows, swept), titles_of_row)
    with ctx.run() as out:
        results = ctx.committed_dir(Path(report_dir(pipeline)))  # lands on success
        copy_heatmaps(dag, partitions, out, missing_ok=args.reuse_committed)
        figures = {}  # file in `results` -> caption
        for method in methods.values():
            own = [r for r in rows if r["method"] == method.name]
            figures.update(method.figures(own, results) if own else {})
        write_report(results, pipeline, rows, figures, str(ctx.output_dir), failed, pending)
        stopped = {f["experiment"] for f in failed}
        logs = round_logs(dag, pending)
        plot_curves(logs, results / "curves.png", curve_labels(rows + failed), stopped)
        ctx.info["rows"] = len(rows)
    print(f"wrote {report_dir(pipeline)}/report.md, report.csv, report.json and curves.png")


def copy_heatmaps(dag, partitions: list[str], out: Path, missing_ok: bool = False) -> None:
    """Each partition's heat-map into the report's output folder. With ``missing_ok`` (a
    report reusing committed rows) a partition that only an earlier workspace made is left
    out: its heat-map went with that workspace, and the rows need none of it."""
    for part in sorted(partitions):
        heatmap = Path(dag.stages[f"partition__{part}"].out) / "heatmap.png"
        if missing_ok and not heatmap.exists():
            continue
        shutil.copy(heatmap, out / f"partition_{part}.png")


def in_column_order(rows: list[dict], values: list) -> list[dict]:
    """The rows, stably sorted by the swept setting when every value is a number, so a sweep
    reads N = 1, 2, 3, 5 whatever order the pipeline lists its experiments in."""
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return rows
    return [rows[i] for i in sorted(range(len(rows)), key=values.__getitem__)]


if __name__ == "__main__":
    main_guard(run)
