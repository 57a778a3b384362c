"""MFCL's own report table (the report's pivots and Tab. 3 columns come from
:mod:`fedssl.report`)."""
from __future__ import annotations

from fedssl.report import pivot_markdown


def rserver_loss_table(rows: list[dict]) -> dict[str, str]:
    """The rServer's final NT-Xent loss beside the accuracy: a loss far below chance,
    ln(2N - 1) for N pairs per batch, with poor features marks a shortcut."""
    mine = [r for r in rows if r.get("rserver_final_loss") is not None]
    if not mine:
        return {}
    return {"rServer's final NT-Xent loss (mean ± std over runs)":
            pivot_markdown(mine, "rserver_final_loss", costs=False)}
