"""The leakage study's table in the layout of MpFedcon Fig. 10 / Tab. 4 (defence side), from
the report rows (every metric of the attack step's metrics.json)."""

from __future__ import annotations

import re

from fedssl.reporting.formatting import markdown_table, number


def leakage_tables(rows: list[dict]) -> dict[str, str]:
    """Per attack setting: label hit rates, final reconstruction MSE, share recovered."""
    tables = {}
    for r in rows:  # the pipeline's rows: only the attack's own have its settings
        settings = [m.group(1) for k in r if (m := re.fullmatch(r"idlg_label_hit_(\w+)", k))]
        if not settings:
            continue
        header = [
            "setting",
            "what the attacker gets",
            "iDLG label hit",
            "DLG label hit",
            "iDLG final MSE",
            "DLG final MSE",
            "iDLG recovered",
            "DLG recovered",
            "iDLG iterations to recover",
            "DLG iterations to recover",
        ]
        lines = []
        for s in settings:
            blind = str(r.get(f"idlg_label_blind_{s}")) == "True"
            lines.append(
                [
                    s,
                    str(r.get(f"about_{s}", "")),
                    f"{_pct(r.get(f'idlg_label_hit_{s}'))}{' (guess)' if blind else ''}",
                    _pct(r.get(f"dlg_label_hit_{s}")),
                    _sci(r.get(f"idlg_final_mse_{s}")),
                    _sci(r.get(f"dlg_final_mse_{s}")),
                    _pct(r.get(f"idlg_recovered_{s}")),
                    _pct(r.get(f"dlg_recovered_{s}")),
                    _plain(r.get(f"idlg_iters_to_recover_{s}")),
                    _plain(r.get(f"dlg_iters_to_recover_{s}")),
                ]
            )
        chance = _pct(r.get("chance_label_hit"))
        tables[f"leakage_{r['experiment']}"] = markdown_table(
            header,
            lines,
            f"Layout of MpFedcon Fig. 10 / Tab. 4 (defence side), "
            f"{r['title']}: label hit rate of the iDLG rule over {r.get('images_label')} "
            f"images and of DLG over {r.get('images_dlg_label')} (chance {chance}); "
            f"reconstructions of {r.get('images_recon')} images by L-BFGS, "
            f"{r.get('iterations')} iterations; final MSE = that of the reconstruction the "
            f"attacker keeps (its lowest gradient-matching loss), pixels in [0, 1]; "
            f"recovered = final MSE below the threshold",
        )
    return tables


def _pct(value) -> str:
    return number(value, ".0%")


def _sci(value) -> str:
    return number(value, ".2g")


def _plain(value) -> str:
    return number(value, "g", blank="–")
