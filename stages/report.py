"""Stage: the table across a pipeline's experiments, plus the partition heat-maps."""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from fedssl.params import load_preset
from fedssl.pipeline import Dag, experiment_dir, partition_dir
from fedssl.report import experiment_row, to_markdown, write_csv
from fedssl.stage import main_guard, stage_run


def run(argv):
    ap = argparse.ArgumentParser(prog="python -m stages.report")
    ap.add_argument("pipeline", help="a pipeline of params/pipelines.yaml")
    pipeline = ap.parse_args(argv).pipeline
    dag = Dag(pipeline)
    exps = {name: load_preset("experiment", name) for name in dag.experiments}
    rows = [experiment_row(n, e, Path(experiment_dir(n))) for n, e in exps.items()]
    with stage_run(dag, f"report__{pipeline}") as (_, out, _device, info):
        table = to_markdown(rows)
        heatmaps = []
        for part in sorted({e.partition for e in exps.values()}):
            shutil.copy(Path(partition_dir(part)) / "heatmap.png", out / f"partition_{part}.png")
            heatmaps.append(f"![{part}](partition_{part}.png)")
        (out / "report.md").write_text(f"# Pipeline `{pipeline}`\n\n{table}\n"
                                       + "\n".join(heatmaps) + "\n")
        write_csv(rows, out / "report.csv")
        info["rows"] = len(rows)
    print(table, end="")


if __name__ == "__main__":
    main_guard(run)
