"""The report: one row per experiment, one column per metric, as Markdown and CSV."""
from __future__ import annotations

import csv
import json
from pathlib import Path

COLUMNS = ["experiment", "title", "partition", "method", "arch", "rounds", "linear_top1",
           "knn_top1", "client_MB_up", "client_MB_down", "pretrain_s", "parameters",
           "alpha_bits", "client_MB_sent", "beta_GFLOPs", "gamma_eq6_MB", "peak_step_MB"]
# Mean per-client costs (the `costs` stage; blank for methods without one), as in Tab. 3.
COST_COLUMNS = {"alpha_bits": ("mean_alpha_bits_paper", 1.0),
                "client_MB_sent": ("mean_bytes_actual", 1e-6),
                "beta_GFLOPs": ("mean_beta_flops", 1e-9),
                "gamma_eq6_MB": ("mean_gamma_eq6_bytes", 1e-6),
                "peak_step_MB": ("mean_peak_step_bytes", 1e-6)}


def experiment_row(name: str, exp, exp_dir: Path) -> dict:
    metrics = json.loads((exp_dir / "metrics.json").read_text())
    meta = json.loads((exp_dir / "pretrain" / "meta.json").read_text())
    comm_file = exp_dir / "pretrain" / "communication.json"
    up = down = 0.0
    if comm_file.exists():
        per_client = json.loads(comm_file.read_text())["per_client"]
        up = sum(c["bytes_up"] for c in per_client) / len(per_client) / 1e6
        down = sum(c["bytes_down"] for c in per_client) / len(per_client) / 1e6
    if exp.pretrain.method == "mfcl":
        cm = exp.mfcl.client_module
        arch = f"{cm.arch}-{cm.norm}"
    else:
        arch = exp.model.arch
    row = {"experiment": name, "title": exp.title, "partition": exp.partition,
           "method": exp.pretrain.method, "arch": arch, "rounds": meta["rounds"],
           "linear_top1": metrics["linear_top1"], "knn_top1": metrics["knn_top1"],
           "client_MB_up": round(up, 2), "client_MB_down": round(down, 2),
           "pretrain_s": meta["wall_seconds"], "parameters": meta["parameters"]}
    cost_file = exp_dir / "costs" / "costs.json"
    cost = json.loads(cost_file.read_text()) if cost_file.exists() else {}
    for col, (key, scale) in COST_COLUMNS.items():
        row[col] = f"{cost[key] * scale:.3g}" if key in cost else ""
    return row


def to_markdown(rows: list[dict], columns=COLUMNS) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_csv(rows: list[dict], path: Path, columns=COLUMNS) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        w.writerows(rows)
