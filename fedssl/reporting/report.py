"""A pipeline's report, the same for every method: the probe metrics as pivots (method down,
setting across, repeated runs as mean ± SD), each method's own tables (its plugin's tables
module, in its paper's terms), a short table of the runs, and figures. ``report.md`` is for
reading; ``report.csv`` and ``report.json`` hold every column of every run, and
``report.json`` also the tables by name (the docs' results pages copy them: `fedssl docs`).

The report stage builds the rows and calls :func:`write_report`; ``python -m fedssl.reporting.report
render`` loads the committed rows and calls the same function, so a change of wording reaches
the committed reports without rerunning anything."""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import math
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from fedssl import evaluations
from fedssl.data.catalog import dataset_spec
from fedssl.params import setting
from fedssl.plan.layout import LOGS, ReportRow
from fedssl.reporting.formatting import (
    markdown_table,
    number,
    pivot_markdown,
    save_figure,
    to_float,
)
from fedssl.reporting.readme_facts import fill_facts

# The full table's fixed columns: the declared accuracies (fedssl.evaluations) come after the
# first part, the declared client costs after the second.
COLUMNS_HEAD = ["experiment", "title", "partition", "method", "arch", "precision", "rounds"]
COLUMNS_TRAFFIC = ["client_MB_up", "client_MB_down", "parameters"]
COLUMNS_TAIL = ["row", "column"]
# The short table of runs: column -> its header (a column shows when some run has it); the
# declared metrics (fedssl.evaluations) come between the first three and the rest.
RUN_COLUMNS = {
    "experiment": "experiment",
    "row": "method",
    "column": "setting",
    "client_MB_up": "MB up / client",
    "client_MB_down": "MB down / client",
    "rounds": "rounds",
    "precision": "precision",
}
TEXT_COLUMNS = ("experiment", "row", "column", "precision")
# Report columns renamed since a committed report.json was written: old -> new (the client
# costs took generic names; a paper's own symbols head only its plugin's tables).
RENAMED = {
    "alpha_bits": "paper_bits",
    "client_MB_sent": "client_MB_exchanged",
    "beta_GFLOPs": "client_GFLOPs",
    "gamma_eq6_MB": "paper_memory_MB",
}


def full_columns() -> list[str]:
    """The full table's fixed columns, the declared metrics among them."""
    accuracies = [m.key for m in evaluations.accuracies()]
    costs = [m.key for m in evaluations.client_costs()]
    return COLUMNS_HEAD + accuracies + COLUMNS_TRAFFIC + costs + COLUMNS_TAIL


def pivot_costs() -> dict[str, str]:
    """The mean per-client costs beside a pivot (blank for methods without a costs stage):
    header -> column."""
    return {m.label: m.key for m in evaluations.client_costs() if m.beside}


def _files(metrics_files: Path | list[Path]) -> list[Path]:
    return [metrics_files] if isinstance(metrics_files, Path) else metrics_files


def _precision(step_metas: list[dict], metrics_files: Path | list[Path]) -> str:
    evaluations = [Path(f).parent / "meta.json" for f in _files(metrics_files)]
    metas = step_metas + [json.loads(m.read_text()) for m in evaluations if m.exists()]
    return "/".join(dict.fromkeys(m["precision"] for m in metas if "precision" in m))


def experiment_row(
    name: str,
    exp,
    method,
    step_dirs: list[Path],
    metrics_files: Path | list[Path],
    costs_dir: Path | None,
) -> dict:
    """One experiment's row: its evaluation metrics (every metrics file of its stages: probes,
    fine-tuning, ...), rounds, parameters and final losses of its method's steps,
    the metrics the steps wrote (a ``metrics.json`` in a step's output), the per-client
    traffic they logged, and its per-client costs (the declared client costs, then any other
    mean a method's costs stage reports, under its own name without ``mean_``)."""
    metrics = {}
    for f in _files(metrics_files):
        metrics.update(json.loads(Path(f).read_text()))
    metas = [json.loads((d / "meta.json").read_text()) for d in step_dirs]
    up, down, per_round = _mean_traffic(step_dirs)
    losses = {
        f"{d.name}_final_loss": _final_loss(m)
        for d, m in zip(step_dirs, metas)
        if _final_loss(m) is not None
    }
    steps = {}  # metrics a method's steps report themselves (their metrics.json)
    for d in step_dirs:
        if (d / "metrics.json").exists():
            steps.update(json.loads((d / "metrics.json").read_text()))
    row = {
        "experiment": name,
        "title": exp.title,
        "partition": exp.partition,
        "method": method.name,
        "arch": method.arch(exp.method),
        "rounds": sum(m.get("rounds", 0) for m in metas),
        # what its steps, then its evaluations (features, probes), computed in; blank for runs
        # made before it was recorded
        "precision": _precision(metas, metrics_files),
        **steps,
        **metrics,
        **losses,
        "client_MB_up": round(up, 2),
        "client_MB_down": round(down, 2),
        **per_round,
        "parameters": next((m["parameters"] for m in metas if "parameters" in m), ""),
    }
    _add_client_costs(row, costs_dir)
    return row


def _mean_traffic(step_dirs: list[Path]) -> tuple[float, float, dict[str, float]]:
    """MB a client sends and receives over the steps (the mean over the clients each step
    logged in its communication.json), and one client's traffic in one round it took part in."""
    up = down = 0.0
    per_round: dict[str, float] = {}
    for d in step_dirs:
        if (d / "communication.json").exists():
            per_client = json.loads((d / "communication.json").read_text())["per_client"]
            up += sum(c["bytes_up"] for c in per_client) / len(per_client) / 1e6
            down += sum(c["bytes_down"] for c in per_client) / len(per_client) / 1e6
            per_round.update(_per_round_traffic(per_client))
    return up, down, per_round


def _add_client_costs(row: dict, costs_dir: Path | None) -> None:
    """Set ``row``'s declared client costs from the costs stage's costs.json (blank without
    one), then any other mean it reports under its own name without ``mean_``."""
    cost_file = costs_dir / "costs.json" if costs_dir else None
    cost = json.loads(cost_file.read_text()) if cost_file and cost_file.exists() else {}
    for metric in evaluations.client_costs():
        key = f"mean_{metric.costs}"
        row[metric.key] = number(cost[key] * metric.scale) if key in cost else ""
    known = {f"mean_{m.costs}" for m in evaluations.client_costs()}
    for key, value in cost.items():
        column = key.removeprefix("mean_")
        if key.startswith("mean_") and key not in known and column not in row:
            row[column] = float(number(value, ".4g"))


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
            out.update(
                {f"round_MB_{way}_{k}": round(v / rounds / 1e6, 6) for k, v in kinds.items()}
            )
    return out


def table_cell(
    exp, method, partition, dataset_name: str, row: str = "method", column: str = "partition"
) -> tuple[str, str]:
    """(row, column) of an experiment in the pivot: the method's label (the title for
    reference rows) or the title, and the data set with its partition or ``leaf=value`` of a
    swept setting."""
    label = method.row_label(exp.method)
    row = exp.title if row == "title" or not label else label
    if column != "partition":
        return row, f"{column.rsplit('.', 1)[-1]}={setting(exp, column)}"
    if partition.label:
        return row, partition.label
    scheme = partition.scheme
    split = {
        "dirichlet": lambda: f"ξ={scheme.alpha:g}",
        "iid": lambda: "IID",
        "shards": lambda: f"{scheme.classes_per_client} classes/client",
        "cyclic_lognormal": lambda: f"{scheme.classes_per_client} classes/client",
        "class_groups": lambda: "class groups",
    }[scheme.kind]()
    return row, f"{dataset_spec(dataset_name).label} {split}"


def trained_no_round(row: dict) -> bool:
    """Whether a report row's run trained no round: a network at its initialisation."""
    return to_float(row.get("rounds")) == 0


def untrained_apart(rows: list[dict], titles_of_row: dict[str, set[str]]) -> list[dict]:
    """Rows whose run trained no round, set apart from their method's line: such a run is a
    network at its initialisation (a reference), not one more seed of the trained runs that
    share its method's label. Where experiments of other titles share its row
    (``titles_of_row``: the pipeline's rows -> its experiments' titles, made or not), its row
    becomes its title; a 0-round run alone in its row keeps it."""
    for r in rows:
        if trained_no_round(r) and len(titles_of_row.get(r["row"], ())) > 1:
            r["row"] = r["title"]
    return rows


def run_columns() -> dict[str, str]:
    """The runs table's columns: column -> header (:data:`RUN_COLUMNS` with the metrics)."""
    head = list(RUN_COLUMNS.items())
    metrics = [(m.key, m.label) for m in evaluations.accuracies()]
    return dict(head[:3] + metrics + head[3:])


def runs_markdown(rows: list[dict]) -> str:
    """One line per run with the columns a reader scans (:func:`run_columns`)."""
    headers = run_columns()
    columns = [c for c in headers if any(r.get(c) not in (None, "") for r in rows)]
    lines = [
        [str(r.get(c, "")) if c in TEXT_COLUMNS else number(r.get(c), "g") for c in columns]
        for r in rows
    ]
    return markdown_table(
        [headers[c] for c in columns],
        lines,
        "One line per run; every column of every run is in report.csv and report.json",
    )


def columns_of(rows: list[dict]) -> list[str]:
    """The full table's columns: the fixed ones (those some row has), then every other."""
    present = {k for r in rows for k in r}
    fixed = full_columns()
    extra = [k for r in rows for k in r if k not in fixed]
    return [c for c in fixed if c in present] + list(dict.fromkeys(extra))


def write_csv(rows: list[dict], path: Path, columns=None) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, columns or columns_of(rows), restval="")
        w.writeheader()
        w.writerows(rows)


def report_tables(rows: list[dict]) -> dict[str, tuple[str, str]]:
    """Name -> (heading, Markdown): the pivots of the metrics present, the tables of each
    method the rows name (its plugin's, in its paper's layout), and the short table of runs."""
    from fedssl.methods import registry

    tables = {}
    for metric in (m for m in evaluations.metrics() if m.pivot):  # its pivot, if it has one
        mine = [r for r in rows if r.get(metric.key) not in (None, "")]
        if mine:
            costs = pivot_costs() if metric.pivot_costs else None
            caption = f"{metric.pivot}, method × setting" + (
                ", then mean per-client costs" if costs else ""
            )
            tables[metric.pivot_name] = (
                metric.pivot,
                pivot_markdown(mine, metric.key, caption, means=costs),
            )
    for method in dict.fromkeys(r["method"] for r in rows):
        # each sees every row (a paper's table may span its methods)
        for name, table in registry.get(method).tables(rows).items():
            tables[name] = (name, table)
    tables["runs"] = ("Runs", runs_markdown(rows))
    return tables


def render(
    pipeline: str,
    rows: list[dict],
    figures: dict[str, str],
    heatmaps: str,
    failed: list[dict] = (),
    pending: list[str] = (),
) -> tuple[str, dict[str, str]]:
    """``report.md``'s text and the tables by name, from the rows, the figures already drawn
    into the report's folder (file -> caption), the folder of the partition heat-maps, the
    runs that stopped with an error (:func:`failed_run`; not in the rows) and the experiments
    not run yet (a report made part by part)."""
    tables = report_tables(rows)
    sections = "".join(f"## {heading}\n\n{table}\n" for heading, table in tables.values())
    sections += "".join(
        f"## {caption}\n\n![{caption}]({file})\n\n" for file, caption in figures.items()
    )
    text = f"# Pipeline `{pipeline}`\n\n{sections}Partition heat-maps: `{heatmaps}/`\n"
    text += _sources(rows) + _failed(failed) + _pending(pending)
    return text, {name: table for name, (_, table) in tables.items()}


def _sources(rows: list[dict]) -> str:
    """Where rows came from when some were taken from other committed reports."""
    taken: dict[str, int] = {}
    for r in rows:
        if r.get("source"):
            taken[r["source"]] = taken.get(r["source"], 0) + 1
    if not taken:
        return ""
    listed = ", ".join(f"`{p}` ({n} runs)" for p, n in sorted(taken.items()))
    return (
        f"\n{sum(taken.values())} of the {len(rows)} rows are committed rows of earlier runs, "
        f"not rerun in the workspace that rendered this report, from the reports of {listed} "
        "(column `source`).\n"
    )


def _failed(failed: list[dict]) -> str:
    if not failed:
        return ""
    lines = [[f["experiment"], f["stage"], f["error"]] for f in failed]
    table = markdown_table(["experiment", "stage", "its error"], lines)
    return f"\n## Runs that stopped with an error (not in the tables above)\n\n{table}"


def _pending(pending: list[str]) -> str:
    if not pending:
        return ""
    names = ", ".join(f"`{n}`" for n in pending)
    return f"\n## Not run yet ({len(pending)} experiments, not in the tables above)\n\n{names}\n"


def failed_run(name: str, stages: list[str], logs: Path = LOGS) -> dict | None:
    """The first of experiment ``name``'s stages whose Snakemake log ends in the stage's own
    error line (a diverged loss, ...): what a report lists instead of the run's row."""
    for stage in stages:
        log = logs / f"{stage}.log"
        errors = [
            line.removeprefix("error: ")
            for line in (log.read_text().splitlines() if log.exists() else [])
            if line.startswith("error: ")
        ]
        if errors:
            return {"experiment": name, "stage": stage, "error": errors[-1]}
    return None


def write_report(
    folder: Path,
    pipeline: str,
    rows: list[dict],
    figures: dict[str, str],
    heatmaps: str,
    failed: list[dict] = (),
    pending: list[str] = (),
) -> None:
    """``report.md``, ``report.csv`` (every column) and ``report.json`` (the rows, the tables
    by name, and what :func:`rerender` needs besides: the figures, the heat-maps' folder,
    where each row's steps wrote their committed results and the runs that failed) in
    ``folder``."""
    text, tables = render(pipeline, rows, figures, heatmaps, failed, pending)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.md").write_text(text)
    write_csv(rows, folder / "report.csv")
    steps = {
        r["experiment"]: {k: str(v) for k, v in r.step_results.items()}
        for r in rows
        if getattr(r, "step_results", None)
    }
    (folder / "report.json").write_text(
        json.dumps(
            {
                "pipeline": pipeline,
                "rows": rows,
                "tables": tables,
                "figures": figures,
                "heatmaps": heatmaps,
                "step_results": steps,
                **({"failed": list(failed)} if failed else {}),
                **({"pending": list(pending)} if pending else {}),
            },
            indent=1,
            ensure_ascii=False,
        )
        + "\n"
    )


def load_saved(folder: Path) -> dict:
    """A committed report's ``report.json``, its rows as :class:`ReportRow` again (with where
    their steps wrote their results), ready for :func:`render` / :func:`write_report`."""
    path = folder / "report.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no committed report here")
    saved = json.loads(path.read_text())
    missing = [k for k in ("pipeline", "rows", "figures", "heatmaps") if k not in saved]
    if missing:
        raise KeyError(f"{path}: lacks {', '.join(missing)} (rerun its report stage)")
    steps = saved.get("step_results", {})
    saved["rows"] = [
        ReportRow({RENAMED.get(k, k): v for k, v in r.items()}, steps.get(r["experiment"], {}))
        for r in saved["rows"]
    ]
    return saved


# What must still hold for a committed row to stand for an experiment today.
IDENTITY = ("title", "partition", "method", "arch")


def committed_rows(pipeline: str = "", root: Path | None = None) -> dict[str, ReportRow]:
    """Every committed report's rows by experiment, each marked with the pipeline whose run it
    came from (``source``): ``pipeline``'s own report first, then the others by name."""
    found: dict[str, ReportRow] = {}
    paths = sorted((root or REPORTS).glob("*/report.json"))
    for path in sorted(paths, key=lambda p: p.parent.name != pipeline):
        saved = load_saved(path.parent)
        for row in saved["rows"]:
            row.setdefault("source", saved["pipeline"])
            found.setdefault(row["experiment"], row)
    return found


def committed_failures(pipeline: str, root: Path | None = None) -> dict[str, dict]:
    """The runs ``pipeline``'s committed report lists as stopped with an error, by experiment:
    a report made over several sessions keeps an earlier session's failure, whose log a fresh
    workspace does not have, instead of listing that run as not made yet."""
    folder = (root or REPORTS) / pipeline
    if not (folder / "report.json").exists():
        return {}
    return {f["experiment"]: f for f in load_saved(folder).get("failed", [])}


def reused_row(name: str, now: dict, committed: dict[str, ReportRow]) -> ReportRow:
    """Experiment ``name``'s committed row, for a workspace without its steps' outputs: its
    :data:`IDENTITY` must equal ``now`` (what the presets give today), and it takes this
    report's pivot cell (``row``, ``column``) from ``now``."""
    if name not in committed:
        raise FileNotFoundError(
            f"{name}: its steps' outputs are not in this workspace and no committed report "
            "has its row (run its stages)"
        )
    row = committed[name]
    changed = [k for k in IDENTITY if str(row.get(k)) != str(now[k])]
    if changed:
        raise ValueError(
            f"{name}: the committed row (from {row['source']}) no longer matches its preset "
            f"in {', '.join(changed)} (run its stages)"
        )
    row.update(row=now["row"], column=now["column"])
    return row


def rerender(folder: Path) -> None:
    """Rewrite a committed report from its ``report.json`` (figures stay as they are)."""
    saved = load_saved(folder)
    write_report(
        folder,
        saved["pipeline"],
        saved["rows"],
        saved["figures"],
        saved["heatmaps"],
        saved.get("failed", []),
        saved.get("pending", []),
    )


# ------------------------------------------------------------------ the docs' tables
REPORTS = Path("results/reports")
# TABLE: a key of the report's tables (a method's own tables may have spaces in their names)
_BLOCK = re.compile(r"(<!-- results: (\w+) (.+?) -->\n)(.*?)(<!-- /results -->)", re.S)


def fill_blocks(text: str, results_root: Path = REPORTS) -> str:
    """``text`` with every block ``<!-- results: PIPELINE TABLE -->...<!-- /results -->``
    refilled from ``results/reports/PIPELINE/report.json`` (a table the report stage wrote),
    and every number of a sentence marked as a fact (:mod:`fedssl.reporting.readme_facts`)
    regenerated."""

    def fill(m: re.Match) -> str:
        path = results_root / m.group(2) / "report.json"
        if not path.exists():
            raise FileNotFoundError(f"{path}: no report of pipeline '{m.group(2)}' (run it)")
        tables = json.loads(path.read_text())["tables"]
        if m.group(3) not in tables:
            raise KeyError(f"{path}: no table '{m.group(3)}' (has {', '.join(tables)})")
        return m.group(1) + tables[m.group(3)] + m.group(5)

    return fill_facts(_BLOCK.sub(fill, text), results_root)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fedssl report")
    sub = ap.add_subparsers(dest="command", required=True)
    again = sub.add_parser(
        "render",
        help="rewrite committed reports (report.md, .csv, .json) "
        "from their report.json rows with the current report code",
    )
    which = again.add_mutually_exclusive_group(required=True)
    which.add_argument("pipelines", nargs="*", default=[], help="pipelines to rewrite")
    which.add_argument("--all", action="store_true", help="every pipeline under results/reports")
    again.add_argument("--curves", action="store_true", help="also redraw curves.png")
    args = ap.parse_args(argv)
    names = (
        sorted(p.parent.name for p in REPORTS.glob("*/report.json")) if args.all else args.pipelines
    )
    try:
        for name in names:
            rerender(REPORTS / name)
            if args.curves:
                redraw_curves(REPORTS / name)
    except (FileNotFoundError, KeyError) as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 1
    print(f"{REPORTS}: {len(names)} reports rewritten ({', '.join(names)})")
    return 0


# ------------------------------------------------------------------ curves
# Per-round metrics a curve panel prefers to the loss, when every run of the panel logs one.
CURVE_METRICS = {"personal_acc": "personal top-1 %", "knn_monitor": "k-NN monitor top-1 %"}


def round_logs(dag, pending: Iterable[str] = ()) -> dict[str, list[Path]]:
    """Each experiment's per-round logs (its stages' TSV plots, in stage order; a layer-wise
    run has one per growth stage): the stage's output in this workspace, or the copy its run
    committed (a reused row, a report rendered elsewhere). :func:`read_round_log` keeps
    those whose first column is ``round``. The ``pending`` runs are left out: a half-made
    training logs its rounds so far, a curve that would stop short of its line's."""
    from fedssl.plan.layout import owner_of, results_dir

    logs: dict[str, list[Path]] = {}
    pending = set(pending)
    for name in [n for n in dag.experiments if n not in pending]:
        for s in dag.of_experiment[name]:
            for p in dag.stages[s].plots:
                if p.endswith(".tsv"):
                    here = Path(p)
                    committed = Path(results_dir(owner_of(dag.stages[s].out))) / here.name
                    logs.setdefault(name, []).append(here if here.exists() else committed)
    return logs


def read_round_log(paths: Path | list[Path]) -> list[dict]:
    """An experiment's rows, round by round: its round logs that exist and start with a
    ``round`` column, one after another, rounds renumbered 1, 2, ... across them."""
    rows = []
    for path in [paths] if isinstance(paths, Path) else paths:
        if path.exists():
            table = list(csv.DictReader(open(path), delimiter="\t"))
            rows += table if table and next(iter(table[0])) == "round" else []
    return [{**r, "round": str(i)} for i, r in enumerate(rows, 1)]


def _seedless(name: str) -> str:
    return re.sub(r"_s(eed)?\d+$", "", name)


def _curve(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """A run's (rounds, values) of ``key``; a round that computes no training loss (a
    clustering round) logs a loss of 0.0, which no loss reaches: not drawn."""
    pairs = [(float(r["round"]), to_float(r.get(key))) for r in rows]
    pairs = [(x, y) for x, y in pairs if y is not None and not (key == "loss" and y == 0.0)]
    return [x for x, _ in pairs], [y for _, y in pairs]


def _stopped(curve: tuple[list[float], list[float]]) -> tuple[list[float], list[float]]:
    """A run that stopped with an error (a loss gone non-finite after its last logged round):
    its last point stands for the error, so the figure marks it where it ended, even where its
    log is as long as its line's other runs and every logged value is finite."""
    x, y = curve
    return x, y[:-1] + [math.nan] if y else y


def plot_curves(
    logs: dict[str, Path | list[Path]],
    path: Path,
    labels: dict[str, tuple[str, str]] | None = None,
    stopped: Iterable[str] = (),
) -> list[str]:
    """Per-round curves of a pipeline's experiments (their round logs) as small multiples:
    a panel per method (``labels``: experiment -> (panel, line), e.g. the report's row and
    column; a run without one takes its seeds' label, else its name less its seed), a line
    per setting as the median over its seeds with a band. A panel shows its accuracy per
    round where every run logs one (:data:`CURVE_METRICS`), the training loss otherwise;
    diverged runs are marked and kept out of the scales
    (:func:`fedssl.reporting.figures.learning_curves`), and so are the runs ``stopped`` with an
    error even where their logs look whole (:func:`_stopped`). Rendered here, so `dvc plots show`
    and the Snakemake report show it offline. Returns the diverged runs."""
    from fedssl.reporting.figures import learning_curves

    series = {name: read_round_log(p) for name, p in logs.items()}
    series = {n: rows for n, rows in series.items() if rows}
    labels = dict(labels or {})
    by_stem = {_seedless(n): label for n, label in labels.items()}
    panels: dict[str, dict[str, list]] = {}
    for name in series:  # a run with no row of its own (it failed): its seeds' label
        panel, line = labels.get(name) or by_stem.get(_seedless(name), (_seedless(name), "runs"))
        panels.setdefault(panel, {}).setdefault(line, []).append(name)
    curves, ylabels, losses = {}, {}, []
    for panel, lines in panels.items():
        runs = [n for names in lines.values() for n in names]
        key = next(
            (k for k in CURVE_METRICS if all(any(r.get(k) for r in series[n]) for n in runs)),
            "loss",
        )
        ylabels[panel] = CURVE_METRICS.get(key, "training loss")
        losses += [panel] if key == "loss" else []
        curves[panel] = {
            line: [_stopped(_curve(series[n], key)) if n in stopped else _curve(series[n], key)
                   for n in names]
            for line, names in lines.items()
        }  # fmt: skip
    if not curves:
        _no_rounds_figure(path)
        return []
    return learning_curves(curves, ylabels, path, loss_panels=losses)


def _no_rounds_figure(path: Path) -> None:
    """The curves' file of a pipeline without federated rounds: a one-line placeholder, so
    the stage's declared output exists and says why it is empty."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 2))
    ax.text(0.5, 0.5, "no federated rounds in this pipeline", ha="center")
    ax.axis("off")
    save_figure(fig, path, dpi=80)
    plt.close(fig)


def curve_labels(rows: list[dict]) -> dict[str, tuple[str, str]]:
    """Experiment -> (panel, line) of :func:`plot_curves`: the report's row label, with its
    encoder where one label names runs on several (a supervised and a personalised FedAvg),
    and its column. ``rows`` may hold the runs that stopped with an error: their records name
    their cell (an older record without one is left to :func:`plot_curves`' fallback)."""
    rows = [r for r in rows if "row" in r]
    archs: dict[str, set] = {}
    for r in rows:
        archs.setdefault(r["row"], set()).add(r.get("arch", ""))
    return {
        r["experiment"]: (
            r["row"] + (f" · {r.get('arch', '')}" if len(archs[r["row"]]) > 1 else ""),
            r["column"],
        )
        for r in rows
    }


def redraw_curves(folder: Path) -> list[str]:
    """A committed report's ``curves.png`` again, from its rows and its runs' committed round
    logs (its pipeline's DAG says where they are). The command line's, not the report stage's:
    the planner is imported by name, so it is no code dependency of that stage."""
    Dag = importlib.import_module("fedssl.plan.dag").Dag

    saved = load_saved(folder)
    failed = saved.get("failed", [])
    labels = curve_labels(saved["rows"] + failed)
    stopped = {f["experiment"] for f in failed}
    logs = round_logs(Dag(saved["pipeline"]), saved.get("pending", []))
    return plot_curves(logs, folder / "curves.png", labels, stopped)


if __name__ == "__main__":
    sys.exit(main())
