"""CP-CFL's Tab. 3 layout says per row how many IFCA restarts ran (and in how many runs), and
the round the true groups were found both from round 1 and from the end of T_c: IFCA (None)
has no T_c, so only the absolute round compares it with CP-CFL fairly. The committed smoke
reports are rendered with these columns from their own rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedssl.methods.cpcfl.tables import tab3

REPORTS = Path(__file__).resolve().parents[3] / "results" / "reports"


def run(row: str, restarts: int = 0, found: int | None = 3, explore: int = 0) -> dict:
    return {
        "row": row,
        "personal_at_30": 80.0,
        "restarts": restarts,
        "groups_found_at": found,
        "explore_rounds": explore,
    }


def cells(table: str) -> dict[str, dict[str, str]]:
    """A markdown table as {first cell: {header: cell}}."""
    lines = [ln for ln in table.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    out = {}
    for line in lines[2:]:
        row = [c.strip() for c in line.strip("|").split("|")]
        out[row[0]] = dict(zip(header, row))
    return out


def test_restarts_are_counted_per_row_with_the_runs_that_restarted():
    rows = [run("IFCA (None)", r) for r in (0, 2, 1)] + [run("CP-CFL (SimCLR)", 0, explore=5)] * 3
    table = cells(tab3(rows))
    assert table["IFCA (None)"]["restarts run"] == "3 in 2/3 runs"
    assert table["CP-CFL (SimCLR)"]["restarts run"] == "0"


def test_groups_found_is_given_in_absolute_rounds_and_after_T_c():
    """IFCA finds the groups in round 3 (no T_c: 3 after it); CP-CFL with T_c = 5 in rounds 6
    and 7 (1.5 after T_c, yet later than IFCA in absolute rounds); a run that never finds them
    is left out of the mean and counted."""
    rows = [run("IFCA (None)", found=3), run("IFCA (None)", found=3)]
    rows += [run("CP-CFL", found=6, explore=5), run("CP-CFL", found=7, explore=5)]
    rows += [run("CP-CFL", found=None, explore=5)]
    table = cells(tab3(rows))
    ifca, cpcfl = table["IFCA (None)"], table["CP-CFL"]
    assert (
        ifca["groups found (round)"] == "3.0" and ifca["groups found (rounds after T_c)"] == "3.0"
    )
    assert cpcfl["groups found (round)"] == "6.5 (2/3)"
    assert cpcfl["groups found (rounds after T_c)"] == "1.5 (2/3)"
    never = cells(tab3([run("FedAvg", found=None)] * 2))["FedAvg"]
    assert never["groups found (round)"] == "never (0/2)"


@pytest.mark.parametrize(
    "pipeline", ["cpcfl_smoke", "cpcfl_smoke_trials10", "cpcfl_smoke_clusters", "cpcfl_smoke_heads"]
)
def test_the_committed_reports_carry_the_restart_and_absolute_round_columns(pipeline):
    saved = json.loads((REPORTS / pipeline / "report.json").read_text())
    assert saved["tables"]["cpcfl_tab3"] == tab3(saved["rows"])
    assert "restarts run" in saved["tables"]["cpcfl_tab3"]
    assert "groups found (round)" in (REPORTS / pipeline / "report.md").read_text()


def test_cpcfl_smoke_says_no_restart_ran_and_ifca_found_the_groups_before_cp_cfl():
    """What the committed smoke grid shows: restarts never fired (so IFCA (None) with and
    without them are the same runs), and IFCA (None) (no T_c) found the groups in earlier
    absolute rounds than CP-CFL, which finds them soon after its T_c = 5."""
    table = cells(
        json.loads((REPORTS / "cpcfl_smoke" / "report.json").read_text())["tables"]["cpcfl_tab3"]
    )
    assert {row["restarts run"] for row in table.values()} == {"0"}
    ifca = float(table["IFCA (None)"]["groups found (round)"])
    for name in ("CP-CFL (BYOL)", "CP-CFL (SimSiam)"):
        assert float(table[name]["groups found (round)"]) > ifca
        assert float(table[name]["groups found (rounds after T_c)"]) < ifca
