"""The report: the accuracy tables in the layout of MFCL Tab. 2 (methods down, data set and
partition across, repeated runs as mean ± std) with the per-client costs of Tab. 3 beside them,
and one row per experiment with every metric, as Markdown, CSV and JSON (``report.json`` holds
the tables by name, which ``python -m fedssl.report readme`` copies into the README)."""
from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from pathlib import Path

from fedssl.params import setting

DATASET_LABELS = {"fashion_mnist": "F-MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100",
                  "stl10": "STL-10", "tiny_imagenet": "Tiny"}
# Tab. 3's per-client cost columns beside the pivot: header -> the row's column (its units).
PIVOT_COSTS = {"α (bits)": "alpha_bits", "β (GFLOPs)": "beta_GFLOPs",
               "γ Eq. 6 (MB)": "gamma_eq6_MB", "sent (MB)": "client_MB_sent"}

COLUMNS = ["experiment", "title", "partition", "method", "arch", "rounds", "linear_top1",
           "knn_top1", "client_MB_up", "client_MB_down", "parameters",
           "alpha_bits", "client_MB_sent", "beta_GFLOPs", "gamma_eq6_MB", "peak_step_MB",
           "row", "column"]
# The pivots the report opens with, for the metrics its experiments have (title, costs beside).
PIVOTS = {"linear": ("linear_top1", "Linear probe top-1 % (layout of MFCL Tab. 2; per-client "
                                    "costs as Tab. 3)", True),
          "knn": ("knn_top1", "k-NN top-1 %", False),
          "personal": ("personal_top1", "Personalised accuracy % (each client's model on its "
                                        "own test split, final round)", True)}
# Mean per-client costs (the `costs` stage; blank for methods without one), as in Tab. 3.
COST_COLUMNS = {"alpha_bits": ("mean_alpha_bits_paper", 1.0),
                "client_MB_sent": ("mean_bytes_actual", 1e-6),
                "beta_GFLOPs": ("mean_beta_flops", 1e-9),
                "gamma_eq6_MB": ("mean_gamma_eq6_bytes", 1e-6),
                "peak_step_MB": ("mean_peak_step_bytes", 1e-6)}


def experiment_row(name: str, exp, method, step_dirs: list[Path],
                   metrics_files: Path | list[Path], costs_dir: Path | None) -> dict:
    """One experiment's row: its evaluation metrics (every metrics file of its stages: probes,
    fine-tuning, ...), rounds, parameters and final losses of its method's steps,
    the metrics the steps wrote (a ``metrics.json`` in a step's output), the per-client
    traffic they logged, and its per-client costs (the Tab. 3 columns, then any other mean a
    method's costs stage reports, under its own name without ``mean_``)."""
    metrics = {}
    for f in [metrics_files] if isinstance(metrics_files, Path) else metrics_files:
        metrics.update(json.loads(Path(f).read_text()))
    metas = [json.loads((d / "meta.json").read_text()) for d in step_dirs]
    up = down = 0.0
    per_round: dict[str, float] = {}  # one client's traffic in one round it took part in
    for d in step_dirs:
        if (d / "communication.json").exists():
            per_client = json.loads((d / "communication.json").read_text())["per_client"]
            up += sum(c["bytes_up"] for c in per_client) / len(per_client) / 1e6
            down += sum(c["bytes_down"] for c in per_client) / len(per_client) / 1e6
            per_round.update(_per_round_traffic(per_client))
    losses = {f"{d.name}_final_loss": _final_loss(m) for d, m in zip(step_dirs, metas)
              if _final_loss(m) is not None}
    steps = {}  # metrics a method's steps report themselves (their metrics.json)
    for d in step_dirs:
        if (d / "metrics.json").exists():
            steps.update(json.loads((d / "metrics.json").read_text()))
    row = {"experiment": name, "title": exp.title, "partition": exp.partition,
           "method": method.name, "arch": method.arch(exp.method),
           "rounds": sum(m.get("rounds", 0) for m in metas), **steps, **metrics, **losses,
           "client_MB_up": round(up, 2), "client_MB_down": round(down, 2), **per_round,
           "parameters": next((m["parameters"] for m in metas if "parameters" in m), "")}
    cost_file = costs_dir / "costs.json" if costs_dir else None
    cost = json.loads(cost_file.read_text()) if cost_file and cost_file.exists() else {}
    for col, (key, scale) in COST_COLUMNS.items():
        row[col] = f"{cost[key] * scale:.3g}" if key in cost else ""
    known = {key for key, _ in COST_COLUMNS.values()}
    for key, value in cost.items():
        column = key.removeprefix("mean_")
        if key.startswith("mean_") and key not in known and column not in row:
            row[column] = float(f"{value:.4g}")
    return row


def _final_loss(meta: dict) -> float | None:
    """A step's last training loss, as its meta.json records it (a value or a per-epoch list)."""
    loss = meta.get("final_loss", meta.get("loss"))
    if isinstance(loss, list):
        loss = loss[-1] if loss else None
    return round(float(loss), 4) if loss is not None else None


def _per_round_traffic(per_client: list[dict]) -> dict[str, float]:
    """MB one client sends / receives in a round it takes part in (the papers' "traffic per
    transfer"), in total and, when a method exchanges several kinds of tensors, per kind."""
    rounds = sum(c["rounds"] for c in per_client)
    if not rounds:
        return {}
    out = {}
    for way in ("up", "down"):
        kinds: dict[str, int] = {}
        for c in per_client:
            for kind, size in c[f"{way}_by_kind"].items():
                kinds[kind] = kinds.get(kind, 0) + size
        out[f"round_MB_{way}"] = round(sum(kinds.values()) / rounds / 1e6, 4)
        if len(kinds) > 1:
            out.update({f"round_MB_{way}_{k}": round(v / rounds / 1e6, 6)
                        for k, v in kinds.items()})
    return out


def table_cell(exp, method, partition, dataset_name: str, row: str = "method",
               column: str = "partition") -> tuple[str, str]:
    """(row, column) of an experiment in the pivot: the method's label (the title for
    reference rows) or the title, and the data set with its partition or ``leaf=value`` of a
    swept setting."""
    label = method.row_label(exp.method)
    row = exp.title if row == "title" or not label else label
    if column != "partition":
        return row, f"{column.rsplit('.', 1)[-1]}={setting(exp, column)}"
    scheme = partition.scheme
    split = {"dirichlet": lambda: f"ξ={scheme.alpha:g}", "iid": lambda: "IID",
             "shards": lambda: f"{scheme.classes_per_client} classes/client",
             "class_groups": lambda: "class groups"}[scheme.kind]()
    return row, f"{DATASET_LABELS.get(dataset_name, dataset_name)} {split}"


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f}±{statistics.stdev(values):.2f}"


def _first_seen(items) -> list:
    return list(dict.fromkeys(items))


def pivot_markdown(rows: list[dict], metric: str, costs: bool = True) -> str:
    """``metric`` per (row, column) cell, mean ± sample std over the runs sharing a cell; with
    ``costs``, then the row's mean per-client costs (Tab. 3; blank for methods without a costs
    stage)."""
    row_labels = _first_seen(r["row"] for r in rows)
    col_labels = _first_seen(r["column"] for r in rows)
    cells: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        cells.setdefault((r["row"], r["column"]), []).append(float(r[metric]))
    cost_keys = PIVOT_COSTS if costs else {}
    header = ["method", *col_labels, *cost_keys]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label in row_labels:
        mine = [r for r in rows if r["row"] == label]
        cost_cells = []
        for key in cost_keys.values():
            values = [float(r[key]) for r in mine if r[key] != ""]
            cost_cells.append(f"{statistics.mean(values):.3g}" if values else "")
        accs = [_mean_std(cells[(label, c)]) if (label, c) in cells else "" for c in col_labels]
        lines.append("| " + " | ".join([label, *accs, *cost_cells]) + " |")
    return "\n".join(lines) + "\n"


def columns_of(rows: list[dict]) -> list[str]:
    """The report's columns: the fixed ones (those some row has), then every other metric."""
    present = {k for r in rows for k in r}
    extra = [k for r in rows for k in r if k not in COLUMNS]
    return [c for c in COLUMNS if c in present] + list(dict.fromkeys(extra))


def to_markdown(rows: list[dict], columns=None) -> str:
    columns = columns or columns_of(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    return "" if value is None else str(value)


def write_csv(rows: list[dict], path: Path, columns=None) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, columns or columns_of(rows), restval="")
        w.writeheader()
        w.writerows(rows)


def report_tables(rows: list[dict], methods) -> dict[str, tuple[str, str]]:
    """Name -> (heading, Markdown): the pivots of the metrics present, each method's own
    paper-layout tables, and every run."""
    tables = {}
    for name, (metric, heading, costs) in PIVOTS.items():
        mine = [r for r in rows if r.get(metric) not in (None, "")]
        if mine:
            tables[name] = (heading, pivot_markdown(mine, metric, costs))
    for method in methods:  # each sees every row (a paper's table may span its methods)
        for name, table in method.tables(rows).items():
            tables[name] = (name, table)
    tables["runs"] = ("All runs", to_markdown(rows))
    return tables


# ------------------------------------------------------------------ README tables
README = Path("README.md")
# TABLE: a key of the report's tables (a method's own tables may have spaces in their names)
_BLOCK = re.compile(r"(<!-- results: (\w+) (.+?) -->\n)(.*?)(<!-- /results -->)", re.S)


def readme_text(text: str, results_root: Path = Path("results/reports")) -> str:
    """``text`` with every block ``<!-- results: PIPELINE TABLE -->...<!-- /results -->``
    refilled from ``results/reports/PIPELINE/report.json`` (a table the report stage wrote)."""
    def fill(m: re.Match) -> str:
        path = results_root / m.group(2) / "report.json"
        if not path.exists():
            raise FileNotFoundError(f"{path}: no report of pipeline '{m.group(2)}' (run it)")
        tables = json.loads(path.read_text())["tables"]
        if m.group(3) not in tables:
            raise KeyError(f"{path}: no table '{m.group(3)}' (has {', '.join(tables)})")
        return m.group(1) + tables[m.group(3)] + m.group(5)
    return _BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedssl.report")
    ap.add_argument("command", choices=["readme"], help="readme: refill the README's result "
                    "tables from the committed reports (results/reports/*/report.json)")
    ap.add_argument("--check", action="store_true", help="only say whether it is up to date")
    args = ap.parse_args(argv)
    old = README.read_text()
    new = readme_text(old)
    if args.check:
        if new != old:
            print("README.md: result tables differ from results/reports: run "
                  "`python -m fedssl.report readme`", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    print(f"{README}: {len(_BLOCK.findall(new))} result tables refilled")
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------ curves
def plot_curves(logs: dict[str, Path], path: Path) -> None:
    """Per-round curves of a pipeline's experiments (their committed round logs) as one PNG:
    the training loss, and the personalised accuracy where a method logs it. Rendered here,
    so `dvc plots show` and the Snakemake report show it offline."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    series = {name: list(csv.DictReader(open(p), delimiter="\t")) for name, p in logs.items()
              if p.exists()}
    series = {n: rows for n, rows in series.items() if rows}
    panels = ["loss"] + (["personal_acc"] if any("personal_acc" in r[0] for r in series.values())
                         else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, key in zip(axes[0], panels):
        for name, rows in series.items():
            xs = [int(r["round"]) for r in rows if r.get(key)]
            ax.plot(xs, [float(r[key]) for r in rows if r.get(key)], label=name, marker=".")
        ax.set_xlabel("round")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    if series:
        axes[0][0].legend(fontsize=7)
    else:
        axes[0][0].text(0.5, 0.5, "no federated rounds in this pipeline", ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
