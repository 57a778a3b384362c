"""The shared evaluations and their metrics are drop-in declarations (fedssl/evaluations/): the
planner takes the stages from them, in an order where every input comes first, and the report
and the board take every metric's label and pivot from them, not from tables of their own."""

from __future__ import annotations

import pytest

from fedssl import board, evaluations, report
from fedssl.contract import DATA, PARTITION
from fedssl.evaluations import Metric


def test_the_evaluations_join_an_experiment_after_those_they_read():
    kinds = [e.kind for e in evaluations.all()]
    assert kinds == ["personal", "features", "evaluate", "finetune", "costs"]
    for i, ev in enumerate(evaluations.all()):
        assert set(ev.inputs) - {DATA, PARTITION} <= set(kinds[:i]), ev.kind


def test_each_metric_is_declared_once_with_its_presentation():
    declared = {m.key: m for m in evaluations.metrics()}
    assert list(declared) == [
        "linear_top1",
        "knn_top1",
        "global_top1",
        "personal_top1",
        "finetune_top1",
    ]
    assert declared["knn_top1"].label == "k-NN" and declared["knn_top1"].unit == "%"
    with pytest.raises(ValueError, match="knn_top1"):
        evaluations.declare(Metric("knn_top1", "kNN", order=20))


def test_report_and_board_read_the_declarations():
    rows = [
        {"experiment": "a", "row": "M", "column": "S", "method": "none", "knn_top1": 71.5},
        {"experiment": "b", "row": "N", "column": "S", "method": "none", "personal_top1": 60.0},
    ]
    tables = report.report_tables(rows)
    assert list(tables) == ["knn", "personal", "runs"]
    assert tables["knn"][0] == "k-NN top-1 %"
    assert "| k-NN | personal |" in tables["runs"][1]
    assert board.EVALUATIONS["ssl"][1] == {
        "linear_top1": "linear",
        "knn_top1": "k-NN",
        "finetune_top1": "fine-tune",
    }
    # the personalised table leads with the mean over the last rounds, then the declared metric
    assert board.EVALUATIONS["personal"][1] == {
        "personal_last": "personal",
        "personal_top1": "last round",
    }


def test_a_declared_metric_gets_its_pivot_and_its_runs_column(monkeypatch):
    share = Metric(
        "largest_share",
        "largest share",
        order=60,
        unit="",
        higher_is_better=False,
        pivot="Largest client share",
        pivot_name="balance",
    )
    monkeypatch.setitem(evaluations._METRICS, share.key, share)
    rows = [{"experiment": "a", "row": "M", "column": "S", "method": "none", "largest_share": 0.4}]
    tables = report.report_tables(rows)
    assert tables["balance"][0] == "Largest client share"
    assert "| largest share |" in tables["runs"][1]
