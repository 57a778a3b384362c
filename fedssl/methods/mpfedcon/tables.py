"""The report's tables in the layout of MpFedcon's Tabs. 1-4 and Fig. 10, from the report rows
(every metric of each experiment's metrics.json, its traffic, its pivot row and column).

Repeated runs of one cell (seeds) are shown as mean ± sample SD; each table's caption says so
and how many runs a cell averages. Table names are identifiers (the README's result
blocks name them).
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from fedssl.reporting.formatting import (
    markdown_table,
    mean_sd,
    number,
    paper_row,
    ranked,
    read_tsv,
    sd_note,
    to_float,
)

SD = "sample"
PAPER_TAB1 = Path(__file__).with_name("paper_tab1.tsv")
# The data set whose paper column stands beside a data set the paper did not use.
PAPER_STAND_IN = "CIFAR-10"
SHARDS = re.compile(r"^(?P<dataset>.*) (?P<classes>\d+) classes/client$")

# Tab. 1's row order (the variants' labels; noise and split ablations follow their base)
ORDER = (
    "SOLO",
    "FedAvg",
    "FedAvg+FT",
    "FedProx",
    "SCAFFOLD",
    "Per-FedAvg",
    "APFL",
    "Ditto",
    "FedPer",
    "LG-FedAvg",
    "FedRep",
    "MpFedcon",
)
NOISY = re.compile(r" \+ [GL] ")


def _rank(label: str) -> tuple:
    base = label.split(" ")[0]
    return (ORDER.index(base) if base in ORDER else len(ORDER), bool(NOISY.search(label)), label)


def _sd(values: list[float], spec: str = ".2f") -> str:
    return mean_sd(values, SD, spec)


def seeds(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"


def _last_key(rows: list[dict]) -> str | None:
    for r in rows:
        for k in r:
            if re.fullmatch(r"personal_last\d+", k):
                return k
    return None


def _grid(rows: list[dict], value) -> tuple[list[str], list[str], dict]:
    """Row labels (paper order), column labels (first seen) and (row, column) -> values."""
    labels = sorted({r["row"] for r in rows}, key=_rank)
    columns = list(dict.fromkeys(r["column"] for r in rows))
    cells: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        v = value(r)
        if v is not None:
            cells.setdefault((r["row"], r["column"]), []).append(v)
    return labels, columns, cells


def paper_tab1() -> dict[tuple[str, str, int], tuple[int, float, str]]:
    """(method, data set, S) -> (parties, top-1, the setting our row names) of the paper's
    Tab. 1."""
    return {
        (r["method"], r["dataset"], int(r["classes"])): (
            int(r["parties"]),
            float(r["top1"]),
            r["setting"],
        )
        for r in read_tsv(PAPER_TAB1)
    }


def paper_column(column: str, paper: dict) -> tuple[str, int] | None:
    """The paper's (data set, S) for one of our columns: the same data set and S where the
    paper has them, else CIFAR-10 with the same S, else none."""
    match = SHARDS.match(column)
    if match is None:
        return None
    classes = int(match["classes"])
    for dataset in (match["dataset"], PAPER_STAND_IN):
        if any(d == dataset and c == classes for _, d, c in paper):
            return dataset, classes
    return None


def tab1(rows: list[dict], key: str) -> str:
    """Ours per column (mean ± SD over seeds, ranked), each beside the paper's column for the
    same data set and S (CIFAR-10 standing in for a data set the paper did not use)."""
    labels, columns, cells = _grid(rows, lambda r: to_float(r.get(key)))
    paper = paper_tab1()
    runs = {len(v) for v in cells.values()}
    header, ranked_columns = ["Method"], []
    for c in columns:
        ours = {
            label: (statistics.mean(v), _sd(v)) for label in labels if (v := cells.get((label, c)))
        }
        header.append(c)
        ranked_columns.append(ranked(ours))
        if (ref := paper_column(c, paper)) is not None:
            dataset, classes = ref
            theirs = {
                label: (top1, f"{top1:.2f}")
                for (method, d, s), (_, top1, setting) in paper.items()
                if (d, s) == ref and (label := paper_row(labels, method, setting))
            }
            parties = next(n for (_, d, s), (n, _, _) in paper.items() if (d, s) == ref)
            header.append(f"paper {dataset} ({parties},{classes})")
            ranked_columns.append(ranked(theirs))
    lines = [[label, *(col.get(label, "") for col in ranked_columns)] for label in labels]
    n = seeds(runs.pop()) if len(runs) == 1 else "the seeds of each cell (their number varies)"
    return markdown_table(
        header,
        lines,
        f"Layout of MpFedcon Tab. 1: personalised top-1 % (each party's model "
        f"on its own test split), mean over parties and the last "
        f"{key.removeprefix('personal_last')} rounds; {sd_note(SD, n)}; (k) = rank in the "
        "column; the paper's columns (n parties, S classes each; CIFAR-10 where the paper "
        "has not our data set; beside the row of the paper's setting: MpFedcon μ = 10, "
        "SCAFFOLD and APFL as FedRep's code runs them, Per-FedAvg first-order): compare "
        "rankings, not values",
    )


def tab2(rows: list[dict], key: str) -> str:
    """Accuracy at half and all of the rounds (the paper's T=100 / T=200 columns), the last-N
    mean as if the run had stopped there."""
    header, lines, columns = ["Method"], [], list(dict.fromkeys(r["column"] for r in rows))
    stops = sorted({int(r["rounds"]) for r in rows})
    picks = []
    for c in columns:
        for t in stops:
            for r_at in sorted({round(t / 2), t}):
                picks.append((c, r_at))
                header.append(f"{c}, T={r_at}")
    labels = sorted({r["row"] for r in rows}, key=_rank)
    for label in labels:
        line = [label]
        for c, r_at in picks:
            vals = [
                to_float(r.get(f"{key}_at_{r_at}"))
                for r in rows
                if r["row"] == label and r["column"] == c
            ]
            line.append(_sd([v for v in vals if v is not None]))
        lines.append(line)
    return markdown_table(
        header,
        lines,
        "Layout of MpFedcon Tab. 2: accuracy after T rounds "
        f"(mean of rounds T-{key.removeprefix('personal_last')}+1..T of one "
        f"run), {sd_note(SD, 'seeds')}",
    )


def _tab3_cells(mine: list[dict], fedavg: list[dict]) -> list[str]:
    """One (method, setting) cell group of Tab. 3: rounds to the target over the seeds that
    reach it, speedup over FedAvg's rounds, MB per transfer, Eq. 10's traffic, and the
    traffic measured over the whole run."""
    reached = [to_float(r["rounds_to_target"]) for r in mine]
    hit = [v for v in reached if v is not None]
    mb = [to_float(r.get("round_MB_up")) or 0.0 for r in mine]
    total = [
        (to_float(r.get("client_MB_up")) or 0) + (to_float(r.get("client_MB_down")) or 0)
        for r in mine
    ]
    base = [v for v in (to_float(r["rounds_to_target"]) for r in fedavg) if v is not None]
    rounds = _sd(hit, ".1f") + (
        "" if len(hit) == len(reached) else f" ({len(hit)}/{len(reached)} reached)"
    )
    speed = number(statistics.mean(base) / statistics.mean(hit), ".2f") if hit and base else ""
    per = statistics.mean(mb) if mb else 0.0
    traffic = number(statistics.mean(hit) * per) if hit else ""
    return [
        rounds or "not reached",
        speed,
        number(per),
        traffic,
        number(statistics.mean(total)) if total else "",
    ]


def tab3(rows: list[dict]) -> str | None:
    """Rounds to the target accuracy, speedup over FedAvg, MB per transfer and Eq. 10's
    traffic = rounds × MB per transfer, plus the traffic measured over the whole run."""
    rows = [r for r in rows if "rounds_to_target" in r]
    if not rows:
        return None
    labels = sorted({r["row"] for r in rows}, key=_rank)
    columns = list(dict.fromkeys(r["column"] for r in rows))
    header = ["Method"]
    for c in columns:
        header += [
            f"{c}: rounds",
            "speedup",
            "MB/transfer",
            "traffic (MB, Eq. 10)",
            "measured MB/client (up+down)",
        ]
    lines = []
    for label in labels:
        line = [label]
        for c in columns:
            mine = [r for r in rows if r["row"] == label and r["column"] == c]
            fedavg = [r for r in rows if r["row"] == "FedAvg" and r["column"] == c]
            line += _tab3_cells(mine, fedavg)
        lines.append(line)
    return markdown_table(
        header,
        lines,
        "Layout of MpFedcon Tab. 3: rounds until the mean "
        "personalised accuracy first reaches the target (`personal.target`, "
        f"{sd_note(SD, 'the seeds that reach it')}), speedup = FedAvg's "
        "rounds / the method's, MB one party uploads per round it takes part "
        "in (measured), Eq. 10 traffic = rounds × that",
    )


def tab4(rows: list[dict], key: str) -> str | None:
    """Accuracy with noise on the uploads (G / L) against the original and MpFedcon."""
    noisy = [r for r in rows if NOISY.search(r["row"])]
    if not noisy:
        return None
    bases = {r["row"].split(" + ")[0] for r in noisy}
    keep = [
        r
        for r in rows
        if r["row"] in bases or NOISY.search(r["row"]) or r["row"].startswith("MpFedcon")
    ]
    keep = [r for r in keep if r["column"] in {n["column"] for n in noisy}]
    labels, columns, cells = _grid(keep, lambda r: to_float(r.get(key)))
    lines = [[label, *[_sd(cells.get((label, c), [])) for c in columns]] for label in labels]
    return markdown_table(
        ["Method", *columns],
        lines,
        "Layout of MpFedcon Tab. 4 (accuracy side): Gaussian (G) / Laplace "
        "(L) noise of the given variance on every uploaded value, against no "
        "noise and MpFedcon's hidden head, same accuracy as Tab. 1, "
        f"{sd_note(SD, 'seeds')}; whether each defence stops the attacks is "
        "in the leakage table",
    )


def paper_tables(rows: list[dict]) -> dict[str, str]:
    key = _last_key(rows)
    if key is None:
        return {}
    rows = [r for r in rows if to_float(r.get(key)) is not None]
    tables = {"mpfedcon_tab1": tab1(rows, key), "mpfedcon_tab2": tab2(rows, key)}
    for name, table in (("mpfedcon_tab3", tab3(rows)), ("mpfedcon_tab4", tab4(rows, key))):
        if table:
            tables[name] = table
    return tables
