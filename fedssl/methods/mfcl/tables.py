"""MFCL's report tables: the accuracy of every method in the layout of the paper's Tab. 2 with
the paper's numbers beside ours, the per-client costs in the layout of Tab. 3 (α, β, γ beside
the bytes measured), and the rServer's final NT-Xent loss beside the accuracy."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from fedssl.reporting.formatting import (
    markdown_table,
    mean_sd,
    number,
    numbers,
    paper_row,
    pivot_markdown,
    ranked,
    read_tsv,
    sd_note,
    to_float,
)

PAPER_TAB2 = Path(__file__).with_name("paper_tab2.tsv")
# The data set whose paper column stands beside a data set the paper did not use.
PAPER_STAND_IN = "CIFAR-10"
XI = re.compile(r"^(?P<dataset>.*?)\s*ξ=(?P<xi>[0-9.]+)$")

# Tab. 3's columns: header (the paper's symbol, its unit) -> the report row's column, the
# client costs every method reports (fedssl.evaluations.costs): α = bits by Eqs. 4-5,
# β = FLOPs counted, γ = memory by Eq. 6.
TAB3 = {
    "α (bits)": "paper_bits",
    "β (GFLOPs)": "client_GFLOPs",
    "γ Eq. 6 (MB)": "paper_memory_MB",
    "sent + received (MB)": "client_MB_exchanged",
}


def tab3(rows: list[dict]) -> str | None:
    """Each row label's mean per-client costs, for the labels with a costs stage (MFCL's and
    the baselines' it is compared with)."""
    lines = []
    for label in dict.fromkeys(r["row"] for r in rows):
        mine = [r for r in rows if r["row"] == label]
        means = [statistics.mean(v) if (v := numbers(mine, key)) else None for key in TAB3.values()]
        if any(m is not None for m in means):
            lines.append([label, *(number(m) for m in means)])
    if not lines:
        return None
    return markdown_table(
        ["method", *TAB3],
        lines,
        "MFCL, layout of Tab. 3: per-client costs, "
        "mean over the runs of a row: α = bits sent by the paper's formula, "
        "β = training GFLOPs, γ = memory by Eq. 6, sent + received = MB measured",
    )


def paper_tab2() -> dict[tuple[str, str, float], tuple[float, float]]:
    """(method, data set, ξ) -> (mean, SD) of the paper's Tab. 2."""
    return {
        (r["method"], r["dataset"], float(r["xi"])): (float(r["mean"]), float(r["sd"]))
        for r in read_tsv(PAPER_TAB2)
    }


def tab2_accuracy(row: dict) -> float | None:
    """The number Tab. 2 reports for a run: the linear probe's top-1 for a self-supervised
    method, the trained model's own top-1 for a supervised one (whose row also carries a probe
    of its encoder)."""
    trained = to_float(row.get("global_top1"))
    return trained if trained is not None else to_float(row.get("linear_top1"))


def tab2(rows: list[dict]) -> str | None:
    """Method × ξ: ours (mean ± sample SD over seeds) beside the paper's number for the same
    method and ξ, on the same data set where the paper has it and CIFAR-10 otherwise."""
    paper = paper_tab2()
    paper_sets = {d for _, d, _ in paper}
    settings: set[tuple[str, float]] = set()
    cells: dict[tuple[str, str, float], list[float]] = {}
    for r in rows:
        match = XI.match(str(r.get("column", "")))
        acc = tab2_accuracy(r)
        if match is None or acc is None:
            continue
        key = (match["dataset"], float(match["xi"]))
        settings.add(key)
        cells.setdefault((r["row"], *key), []).append(acc)
    labels = list(dict.fromkeys(label for label, _, _ in cells))
    beside = {m: label for m, _, _ in paper if (label := paper_row(labels, m))}
    if len(beside) < 2:  # a table of one paper method, or of ablation rows, ranks nothing
        return None
    settings = sorted(settings)
    header = ["method"]
    for dataset, xi in settings:
        header += [f"{dataset} ξ={xi:g}", f"paper {paper_of(dataset, paper_sets)} ξ={xi:g}"]
    columns = []  # per setting: ours, then the paper's, as label -> (value, cell text)
    for dataset, xi in settings:
        ours = {
            label: (statistics.mean(v), mean_sd(v, "sample", ".1f"))
            for label in labels
            if (v := cells.get((label, dataset, xi)))
        }
        refs = {
            label: (ref[0], f"{ref[0]:.1f}±{ref[1]:.2f}")
            for method, label in beside.items()
            if (ref := paper.get((method, paper_of(dataset, paper_sets), xi)))
        }
        columns += [ranked(ours), ranked(refs)]
    lines = [[label, *(column.get(label, "–") for column in columns)] for label in labels]
    return markdown_table(
        header,
        lines,
        "Layout of MFCL Tab. 2: top-1 % (linear probe for self-supervised methods, the "
        f"trained model for supervised ones), ours {sd_note('sample', 'seeds')}, (k) = rank in "
        "the column; the paper's "
        f"column (ResNet-18/50 at full scale, its own runs' ± SD) is the same data set where "
        f"the paper has it, else {PAPER_STAND_IN}: compare rankings, not values",
    )


def paper_of(dataset: str, paper_sets: set[str]) -> str:
    return dataset if dataset in paper_sets else PAPER_STAND_IN


def tables(rows: list[dict]) -> dict[str, str]:
    """``mfcl_tab3``, and ``mfcl_rserver_loss``: a loss far below chance, ln(2N - 1) for N
    pairs per batch, beside poor features marks a shortcut."""
    out = {}
    if any(r.get("method") == "mfcl" for r in rows):
        if table := tab2(rows):
            out["mfcl_tab2"] = table
        if table := tab3(rows):
            out["mfcl_tab3"] = table
    losses = [r for r in rows if r.get("rserver_final_loss") not in (None, "")]
    if losses:
        out["mfcl_rserver_loss"] = pivot_markdown(
            losses, "rserver_final_loss", "The rServer's final NT-Xent loss, method × setting"
        )
    return out
