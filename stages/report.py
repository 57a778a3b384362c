"""Stage: the table across a pipeline's experiments, plus the partition heat-maps."""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from fedssl.params import load_preset
from fedssl.pipeline import Dag, experiment_dir, partition_dir
from fedssl.report import experiment_row, pivot_markdown, table_cell, to_markdown, write_csv
from fedssl.stage import main_guard, stage_run


def run(argv):
    ap = argparse.ArgumentParser(prog="python -m stages.report")
    ap.add_argument("pipeline", help="a pipeline of params/pipelines.yaml")
    pipeline = ap.parse_args(argv).pipeline
    dag = Dag(pipeline)
    exps = {name: load_preset("experiment", name) for name in dag.experiments}
    rows = []
    for name, exp in exps.items():
        part = load_preset("partition", exp.partition)
        row, column = table_cell(exp, part, load_preset("dataset", part.dataset).name,
                                 dag.row, dag.column)
        rows.append({**experiment_row(name, exp, Path(experiment_dir(name))),
                     "row": row, "column": column})
    with stage_run(dag, f"report__{pipeline}") as (_, out, _device, info):
        table = to_markdown(rows)
        linear = pivot_markdown(rows, "linear_top1")
        heatmaps = []
        for part in sorted({e.partition for e in exps.values()}):
            shutil.copy(Path(partition_dir(part)) / "heatmap.png", out / f"partition_{part}.png")
            heatmaps.append(f"![{part}](partition_{part}.png)")
        (out / "report.md").write_text(
            f"# Pipeline `{pipeline}`\n\n"
            "## Linear probe top-1 % (layout of MFCL Tab. 2; per-client costs as Tab. 3)\n\n"
            f"{linear}\n## k-NN top-1 %\n\n{pivot_markdown(rows, 'knn_top1', costs=False)}\n"
            f"## All runs\n\n{table}\n" + "\n".join(heatmaps) + "\n")
        write_csv(rows, out / "report.csv")
        info["rows"] = len(rows)
    print(f"{linear}\n{table}", end="")


if __name__ == "__main__":
    main_guard(run)
