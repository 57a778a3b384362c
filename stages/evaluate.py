"""Stage: linear probe and k-NN accuracy on the cached features (uniform test split)."""
from __future__ import annotations

import numpy as np

from fedssl.eval.probes import knn_accuracy, linear_probe
from fedssl.params import load_preset
from fedssl.pipeline import experiment_dir
from fedssl.runtime import write_json
from fedssl.stage import main_guard, stage_run
from stages.common import parse_stage


def run(argv):
    dag, stage, name = parse_stage("evaluate", argv, "a params/experiments/<name>.yaml preset")
    exp = load_preset("experiment", name)
    with np.load(f"{experiment_dir(name)}/features/features.npz") as z:
        f = {k: z[k] for k in z.files}
    split = (f["train_x"], f["train_y"], f["test_x"], f["test_y"])
    with stage_run(dag, stage) as (_, out, device, info):
        metrics = {**linear_probe(*split, exp.linear_probe, device),
                   **knn_accuracy(*split, exp.knn, device)}
        metrics = {k: round(v, 2) for k, v in metrics.items()}
        write_json(f"{experiment_dir(name)}/metrics.json", metrics)
        info["metrics"] = metrics


if __name__ == "__main__":
    main_guard(run)
