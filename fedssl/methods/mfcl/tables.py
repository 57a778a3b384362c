"""MFCL's report tables: the per-client costs in the layout of the paper's Tab. 3 (α, β, γ
beside the bytes measured), and the rServer's final NT-Xent loss beside the accuracy."""

from __future__ import annotations

import statistics

from fedssl.report_format import markdown_table, number, numbers, pivot_markdown

# Tab. 3's columns: header -> the report row's column (its unit in the header).
TAB3 = {
    "α (bits)": "alpha_bits",
    "β (GFLOPs)": "beta_GFLOPs",
    "γ Eq. 6 (MB)": "gamma_eq6_MB",
    "sent (MB)": "client_MB_sent",
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
        "β = training GFLOPs, γ = memory by Eq. 6, sent = MB measured",
    )


def tables(rows: list[dict]) -> dict[str, str]:
    """``mfcl_tab3``, and ``mfcl_rserver_loss``: a loss far below chance, ln(2N - 1) for N
    pairs per batch, beside poor features marks a shortcut."""
    out = {}
    if any(r.get("method") == "mfcl" for r in rows) and (table := tab3(rows)):
        out["mfcl_tab3"] = table
    losses = [r for r in rows if r.get("rserver_final_loss") not in (None, "")]
    if losses:
        out["mfcl_rserver_loss"] = pivot_markdown(
            losses, "rserver_final_loss", "The rServer's final NT-Xent loss, method × setting"
        )
    return out
