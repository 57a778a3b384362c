"""Costs that decide: the board's total FLOPs (client + the server's on its behalf) and the
simulated seconds per round on two stated profiles, in place of the contended wall time."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from fedssl import costs
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
    order = list(columns)
    assert (
        "wall_s" not in columns and order.index("total_GFLOPs") == order.index("client_GFLOPs") + 1
    )
    text = board.tables.table("ssl", list(cells.values()), "h")
    assert "total GFLOPs / client (+ server's)" in text and "s / round, phone (sim.)" in text
    assert "phone-class client (20 GFLOP/s) on 10 Mbit/s" in text and "wall s" not in text


def _ledger(folder, per_client: list[tuple[dict, dict]]):
    folder.mkdir()
    rows = [{"up_by_kind": up, "down_by_kind": down} for up, down in per_client]
    (folder / "communication.json").write_text(json.dumps({"per_client": rows}))
    return folder


def test_the_encoder_bytes_are_the_ledgers_encoder_kinds_over_its_steps(tmp_path):
    """A layer-wise client (blocks, embedding and the MoCo heads) counts its blocks and
    embedding over both growth steps, not its heads; a BYOL client its encoder, not its
    predictor; a ledger of one kind (the whole model) cannot tell: no column; the rows gain
    the key and the summary its mean."""
    grow1 = _ledger(
        tmp_path / "g1",
        [({"blocks": 10, "embedding": 2, "heads": 50}, {"blocks": 10, "heads": 50})] * 2,
    )
    grow2 = _ledger(tmp_path / "g2", [({"blocks": 20, "heads": 50}, {"heads": 50}), ({}, {})])
    assert costs.encoder_traffic([grow1, tmp_path / "no_ledger", grow2]) == [42, 22]
    byol = _ledger(tmp_path / "b", [({"encoder": 7, "predictor": 3}, {"encoder": 7})])
    assert costs.encoder_traffic([byol]) == [14]
    whole = _ledger(tmp_path / "m", [({"model": 9}, {"model": 9})])
    assert costs.encoder_traffic([whole]) is None
    rows = [{"client": 1, "bytes_exchanged": 240}, {"client": 0, "bytes_exchanged": 300}]
    got = costs.add_encoder_bytes(rows, [grow1, grow2])
    assert [r["encoder_bytes_exchanged"] for r in got] == [22, 42]
    assert costs.summarize_client_costs(got)["mean_encoder_bytes_exchanged"] == 32
    assert costs.add_encoder_bytes(rows, [whole]) == rows


def test_the_board_shows_the_encoders_mb_beside_the_total():
    """The committed layer-wise rows: FedMoCo exchanges 59.3 MB a client, 13.9 of them its
    encoder's (77 % are the MoCo heads); LW-FedSSL 7.0 and FedMoCo-LW 4.6 of the encoder,
    so the layer-wise saving is 2.0x and 3.0x on the encoder's bytes, 1.13x and 1.18x on
    all of them. A row of the declared column reads it; the column stands next to the
    total's."""
    rows = json.loads(Path("results/reports/board/report.json").read_text())["rows"]
    cells = {
        c["method"]: c
        for c in board.cells.cells(rows, {})
        if c["partition"].endswith("0.1") and c["encoder"].startswith("vit")
    }
    enc = {m: statistics.mean(c["values"]["client_MB_encoder"]) for m, c in cells.items()}
    total = {m: statistics.mean(c["values"]["client_MB_exchanged"]) for m, c in cells.items()}
    assert enc["FedMoCo"] == pytest.approx(13.93) and total["FedMoCo"] == pytest.approx(59.3)
    assert 1 - enc["FedMoCo"] / total["FedMoCo"] == pytest.approx(0.765, abs=0.005)
    assert enc["FedMoCo"] / enc["LW-FedSSL"] == pytest.approx(1.99, abs=0.01)
    assert enc["FedMoCo"] / enc["FedMoCo-LW"] == pytest.approx(3.0, abs=0.01)
    columns = list(board.cells.cost_columns())
    assert columns.index("client_MB_encoder") == columns.index("client_MB_exchanged") + 1
    declared = board.cells.board_values({"experiment": "x", "client_MB_encoder": "2.5"}, {})
    assert declared["client_MB_encoder"] == 2.5
