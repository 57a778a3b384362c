"""CP-CFL's report tables (pure Python): Tab. 3's layout (mean accuracy at T/4, T/2, 3T/4, T,
mean ± SD over the runs of a row) with the cluster-recovery and cost columns, and Tab. 4's
(F1 and AUROC at T). SD is the population SD (ddof = 0), as the paper's Tab. 11 (spec §3)."""

from __future__ import annotations

import re
import statistics

from fedssl.reporting.formatting import markdown_table, mean_sd, number, numbers, sd_note, to_float

AT = re.compile(r"^personal_at_(\d+)$")
SD = "population"  # the paper's convention
OVER_TRIALS = sd_note(SD, "trials")


def _sd(values: list[float], spec: str = ".2f") -> str:
    return mean_sd(values, SD, spec)


def _mean(values: list[float], spec: str = ".3g") -> str:
    return number(statistics.mean(values), spec) if values else ""


def groups(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """Runs grouped by (row, column) in first-seen order; the column joins the label when the
    rows span several columns."""
    columns = list(dict.fromkeys(r.get("column", "") for r in rows))
    out: dict[str, list[dict]] = {}
    for r in rows:
        label = r["row"] if len(columns) == 1 else f"{r['row']} [{r.get('column', '')}]"
        out.setdefault(label, []).append(r)
    return list(out.items())


def groups_found(runs: list[dict], after_tc: bool) -> str:
    """The round from which the choices match the true groups for good (ARI = 1 to the end),
    counted from round 1 of the attempt that stands, or from the end of T_c (``after_tc``):
    mean over the runs that got there, and how many did."""
    got = [
        found - ((to_float(r.get("explore_rounds")) or 0) if after_tc else 0)
        for r in runs
        if (found := to_float(r.get("groups_found_at"))) is not None
    ]
    if not got:
        return f"never (0/{len(runs)})"
    text = number(statistics.mean(got), ".1f")
    return text if len(got) == len(runs) else f"{text} ({len(got)}/{len(runs)})"


def restarts_run(runs: list[dict]) -> str:
    """Restarts that ran over the row's runs, and in how many runs: "0", or "3 in 2/10 runs"."""
    counts = numbers(runs, "restarts")
    if not counts:
        return ""
    total, restarted = int(sum(counts)), sum(1 for c in counts if c)
    return f"{total}" if not total else f"{total} in {restarted}/{len(counts)} runs"


def rate(runs: list[dict], key: str) -> str:
    flags = numbers(runs, key)
    return f"{int(sum(flags))}/{len(flags)}" if flags else ""


# Tab. 3's columns after the accuracy at each checkpoint: header -> its cell from a row's runs.
TAB3_COLUMNS = {
    "best": lambda runs: _sd(numbers(runs, "personal_best")),
    "ARI": lambda runs: _sd(numbers(runs, "ari"), ".3f"),
    "purity": lambda runs: _sd(numbers(runs, "purity"), ".3f"),
    "clusters used": lambda runs: _mean(numbers(runs, "clusters_used"), ".2g"),
    "collapsed at T": lambda runs: rate(runs, "collapsed"),
    "1st attempt failed": lambda runs: rate(runs, "first_attempt_failed"),
    "restarts run": restarts_run,
    "groups found (round)": lambda runs: groups_found(runs, after_tc=False),
    "groups found (rounds after T_c)": lambda runs: groups_found(runs, after_tc=True),
    "relevance": lambda runs: _mean(numbers(runs, "relevance"), ".4f"),
    "MB sent / client": lambda runs: _mean(numbers(runs, "client_MB_exchanged")),
    "GFLOPs / client": lambda runs: _mean(numbers(runs, "client_GFLOPs")),
    "step peak MB": lambda runs: _mean(numbers(runs, "peak_step_MB")),
}


def tab3(rows: list[dict]) -> str:
    checkpoints = sorted(
        {int(m.group(1)) for r in rows for k in r if (m := AT.match(k)) and r[k] not in (None, "")}
    )
    header = ["method (pretraining)"] + [f"T={t}" for t in checkpoints] + list(TAB3_COLUMNS)
    lines = [
        [label]
        + [_sd(numbers(runs, f"personal_at_{t}")) for t in checkpoints]
        + [cell(runs) for cell in TAB3_COLUMNS.values()]
        for label, runs in groups(rows)
    ]
    return markdown_table(
        header,
        lines,
        "CP-CFL, layout of Tab. 3: mean client test accuracy "
        f"(%) at T/4, T/2, 3T/4, T and best ({OVER_TRIALS}, as the paper); "
        "cluster recovery at T; IFCA's restarts on clustering failure (total, and in how many "
        "runs); the round the true groups are found for good, counted from round 1 (a "
        "restarted run: from its last attempt's round 1) and from the end of T_c; "
        "per-client costs.",
    )


TAB4 = {
    "F1-M": "f1_macro",
    "F1-W": "f1_weighted",
    "OvR-M": "auroc_ovr_macro",
    "OvR-W": "auroc_ovr_weighted",
    "OvO-M": "auroc_ovo_macro",
    "OvO-W": "auroc_ovo_weighted",
}


def tab4(rows: list[dict]) -> str:
    lines = [
        [label, *(_sd(numbers(runs, k), ".4f") for k in TAB4.values())]
        for label, runs in groups(rows)
    ]
    return markdown_table(
        ["method (pretraining)", *TAB4],
        lines,
        f"CP-CFL, layout of Tab. 4: pooled F1 and AUROC at T ({OVER_TRIALS}).",
    )


def paper_tables(rows: list[dict]) -> dict[str, str]:
    """``cpcfl_tab3`` and ``cpcfl_tab4`` (names a README results block can refer to)."""
    if not rows:
        return {}
    return {"cpcfl_tab3": tab3(rows), "cpcfl_tab4": tab4(rows)}
