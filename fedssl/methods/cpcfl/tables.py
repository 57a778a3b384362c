"""CP-CFL's report tables (pure Python): Tab. 3's layout (mean accuracy at T/4, T/2, 3T/4, T,
mean ± SD over the runs of a row) with the cluster-recovery and cost columns, and Tab. 4's
(F1 and AUROC at T). SD is the population SD (ddof = 0), as the paper's Tab. 11 (spec §3)."""
from __future__ import annotations

import re
import statistics

AT = re.compile(r"^personal_at_(\d+)$")


def _num(value) -> float | None:
    if value in (None, ""):
        return None
    if isinstance(value, str):
        if value.lower() in ("true", "false"):
            return float(value.lower() == "true")
        try:
            return float(value)
        except ValueError:
            return None
    return float(value)


def _values(runs: list[dict], key: str) -> list[float]:
    return [v for v in (_num(r.get(key)) for r in runs) if v is not None]


def mean_sd(values: list[float], digits: int = 2) -> str:
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f}±{statistics.pstdev(values):.{digits}f}"


def _mean(values: list[float], fmt: str = ".3g") -> str:
    return format(statistics.mean(values), fmt) if values else ""


def groups(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """Runs grouped by (row, column) in first-seen order; the column joins the label when the
    rows span several columns."""
    columns = list(dict.fromkeys(r.get("column", "") for r in rows))
    out: dict[str, list[dict]] = {}
    for r in rows:
        label = r["row"] if len(columns) == 1 else f"{r['row']} [{r.get('column', '')}]"
        out.setdefault(label, []).append(r)
    return list(out.items())


def found_after_tc(runs: list[dict]) -> str:
    """Rounds after T_c until the choices match the true groups for good (ARI = 1 to the end):
    mean over the runs that got there, and how many did."""
    got = [_num(r.get("groups_found_at")) - (_num(r.get("explore_rounds")) or 0)
           for r in runs if _num(r.get("groups_found_at")) is not None]
    if not got:
        return f"never (0/{len(runs)})"
    text = f"{statistics.mean(got):.1f}"
    return text if len(got) == len(runs) else f"{text} ({len(got)}/{len(runs)})"


def rate(runs: list[dict], key: str) -> str:
    flags = _values(runs, key)
    return f"{int(sum(flags))}/{len(flags)}" if flags else ""


def tab3(rows: list[dict]) -> str:
    checkpoints = sorted({int(m.group(1)) for r in rows for k in r
                          if (m := AT.match(k)) and r[k] not in (None, "")})
    header = (["method (pretraining)"] + [f"T={t}" for t in checkpoints]
              + ["best", "ARI", "purity", "clusters used", "collapsed at T",
                 "1st attempt failed", "groups found (rounds after T_c)", "restarts",
                 "relevance", "MB sent / client", "GFLOPs / client", "step peak MB"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, runs in groups(rows):
        cells = [label] + [mean_sd(_values(runs, f"personal_at_{t}")) for t in checkpoints]
        cells += [mean_sd(_values(runs, "personal_best")), mean_sd(_values(runs, "ari"), 3),
                  mean_sd(_values(runs, "purity"), 3), _mean(_values(runs, "clusters_used"), ".2g"),
                  rate(runs, "collapsed"), rate(runs, "first_attempt_failed"),
                  found_after_tc(runs), _mean(_values(runs, "restarts"), ".2g"),
                  _mean(_values(runs, "relevance"), ".4f"),
                  _mean(_values(runs, "client_MB_sent")), _mean(_values(runs, "beta_GFLOPs")),
                  _mean(_values(runs, "peak_step_MB"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


TAB4 = {"F1-M": "f1_macro", "F1-W": "f1_weighted", "OvR-M": "auroc_ovr_macro",
        "OvR-W": "auroc_ovr_weighted", "OvO-M": "auroc_ovo_macro", "OvO-W": "auroc_ovo_weighted"}


def tab4(rows: list[dict]) -> str:
    header = ["method (pretraining)", *TAB4]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, runs in groups(rows):
        lines.append("| " + " | ".join([label] + [mean_sd(_values(runs, k), 4)
                                                  for k in TAB4.values()]) + " |")
    return "\n".join(lines) + "\n"


def paper_tables(rows: list[dict]) -> dict[str, str]:
    """``cpcfl_tab3`` and ``cpcfl_tab4`` (names a README results block can refer to)."""
    if not rows:
        return {}
    return {"cpcfl_tab3": "CP-CFL, layout of Tab. 3: mean client test accuracy (%) at T/4, "
                          "T/2, 3T/4, T and best (mean ± population SD over trials, as the paper); "
                          "cluster recovery at T; per-client costs.\n\n" + tab3(rows),
            "cpcfl_tab4": "CP-CFL, layout of Tab. 4: pooled F1 and AUROC at T (mean ± population "
                          "SD over trials).\n\n" + tab4(rows)}
