"""Costs that decide: the board's total FLOPs (client + the server's on its behalf) and the
simulated seconds per round on two stated profiles, in place of the contended wall time."""

from __future__ import annotations

import pytest

from fedssl.reporting import board
from fedssl.reporting.board import simulate


def test_a_round_on_each_profile_from_flops_and_bytes():
    """1,000 client GFLOPs, 2,000 server GFLOPs and 50 MB over 10 rounds: on the phone
    (20 GFLOP/s, 10 Mbit/s) 50 s + 0.2 s + 40 s, on the workstation (5 TFLOP/s, 1 Gbit/s)
    0.2 s + 0.2 s + 0.4 s, a tenth of each per round; no round, no time."""
    phone, station = simulate.PROFILES["phone"], simulate.PROFILES["workstation"]
    assert simulate.round_seconds(1000, 2000, 50, 10, phone) == pytest.approx(9.02)
    assert simulate.round_seconds(1000, 2000, 50, 10, station) == pytest.approx(0.08)
    assert simulate.round_seconds(1000, 0, 50, 0, phone) is None
    assert simulate.total_gflops(612.0, 1117.0) == 1729.0
    assert simulate.total_gflops(612.0, None) == 612.0 and simulate.total_gflops(None, 5) is None


def _rows(method, **values):
    return [
        {"experiment": f"{method}_s{s}", "row": method, "arch": "cnn", "column": "P"}
        | {"linear_top1": 70.0 + s, **values}
        for s in range(2)
    ]


def test_the_board_shows_total_flops_and_simulated_rounds_not_wall_seconds():
    """A split line whose costs stage counted the server's FLOPs has them in its total (612 +
    1,117) and in its simulated round; a federated line's total is its own; an untrained
    reference (no round) has no simulated time; the wall seconds leave the table but stay
    in the line's values (the curves against wall time read them)."""
    rows = _rows("S", client_GFLOPs=612, server_flops=1.117e12, client_MB_exchanged=1141, rounds=50)
    rows += _rows("F", client_GFLOPs=1350, client_MB_exchanged=33, rounds=50)
    rows += _rows("R", client_MB_exchanged=0, rounds=0)
    cells = {c["method"]: c for c in board.cells.cells(rows, {"S_s0": 60.0, "S_s1": 70.0})}
    split, fed, ref = cells["S"]["values"], cells["F"]["values"], cells["R"]["values"]
    assert split["total_GFLOPs"] == [pytest.approx(1729.0)] * 2
    assert fed["total_GFLOPs"] == [1350.0] * 2
    phone = (612 / 20 + 1117 / 10_000 + 1141 * 8 / 10) / 50
    assert split["sim_s_phone"] == [pytest.approx(phone)] * 2
    assert fed["sim_s_workstation"] == [pytest.approx((1350 / 5000 + 33 * 8 / 1000) / 50)] * 2
    assert "sim_s_phone" not in ref and split["wall_s"] == [60.0, 70.0]
    columns = board.cells.cost_columns()
    assert "wall_s" not in columns and list(columns).index("total_GFLOPs") == 2
    text = board.tables.table("ssl", list(cells.values()), "h")
    assert "total GFLOPs / client (+ server's)" in text and "s / round, phone (sim.)" in text
    assert "phone-class client (20 GFLOP/s) on 10 Mbit/s" in text and "wall s" not in text
