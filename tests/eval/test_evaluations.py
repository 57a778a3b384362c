"""The shared evaluations and their metrics are drop-in declarations (fedssl/evaluations/): the
planner takes the stages from them, in an order where every input comes first, and the report
and the board take every metric's label and pivot from them, not from tables of their own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedssl import evaluations
from fedssl.evaluations import Metric
from fedssl.reporting import board, report
from fedssl.stage.contract import DATA, PARTITION


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
        "paper_bits",
        "client_MB_exchanged",
        "client_MB_encoder",
        "client_GFLOPs",
        "paper_memory_MB",
        "peak_step_MB",
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
    assert board.cells.EVALUATIONS["ssl"][1] == {
        "linear_top1": "linear",
        "knn_top1": "k-NN",
        "finetune_top1": "fine-tune",
    }
    # the personalised table leads with the mean over the last rounds, then the declared metric
    assert board.cells.EVALUATIONS["personal"][1] == {
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


def test_the_experiments_sections_are_the_evaluations_declared_ones(monkeypatch):
    """The experiment model takes its evaluation sections from the registry: a new evaluation
    that declares one adds it (optional when the experiment chooses it, refused for a method
    its ``refuse`` names), with no edit to the experiment model."""
    from pydantic import ValidationError

    from fedssl.evaluations import Evaluation, Section
    from fedssl.experiment import experiment_model
    from fedssl.params import Strict
    from fedssl.presets import Presets
    from tests.fixtures import REPO

    builtin = {"personal", "features", "linear_probe", "knn", "finetune"}
    assert {s.name for s in evaluations.sections()} == builtin
    assert builtin <= set(experiment_model().model_fields)

    class BalanceParams(Strict):
        bins: int = 4

    refuse = lambda method: "keeps no partition" if method.name == "none" else None  # noqa: E731
    balance = Evaluation(
        "balance", ("balance",), (PARTITION,), lambda method, exp: exp.balance is not None,
        order=60, sections=(Section("balance", BalanceParams, by_method=False, refuse=refuse),),
    )  # fmt: skip
    monkeypatch.setitem(evaluations._EVALUATIONS, "balance", balance)
    model = experiment_model()
    presets = Presets(REPO / "params")
    fedsimclr, untrained = (
        presets.load("experiment", name).model_dump(exclude_none=True)
        for name in ("fmnist_fedsimclr", "fmnist_random_init")
    )
    assert model.model_validate({**fedsimclr, "balance": {"bins": 2}}).balance.bins == 2
    assert model.model_validate(fedsimclr).balance is None
    with pytest.raises(ValidationError, match="'none' keeps no partition: remove `balance`"):
        model.model_validate({**untrained, "balance": {}})


def test_the_generic_client_costs_have_generic_names_and_mfcl_keeps_its_symbols():
    """Every method's cost columns are named for what they count (bytes exchanged, FLOPs,
    memory, with their unit), the same names from the costs stage's file to the report and the
    board; MFCL's α, β, γ and Eq. 6 head only MFCL's own tables."""
    from fedssl import costs
    from fedssl.methods.mfcl import tables as mfcl_tables

    declared = {m.key: m for m in evaluations.client_costs()}
    assert {k: (m.costs, m.unit, m.scale) for k, m in declared.items()} == {
        "paper_bits": ("paper_bits", "bits", 1.0),
        "client_MB_exchanged": ("bytes_exchanged", "MB", 1e-6),
        "client_MB_encoder": ("encoder_bytes_exchanged", "MB", 1e-6),
        "client_GFLOPs": ("flops", "GFLOPs", 1e-9),
        "paper_memory_MB": ("paper_memory_bytes", "MB", 1e-6),
        "peak_step_MB": ("peak_step_bytes", "MB", 1e-6),
    }
    assert not any(m.higher_is_better for m in declared.values())
    # the costs stage writes the means of the keys the declarations read
    assert tuple(m.costs for m in declared.values()) == costs.CLIENT_COSTS
    generic = [
        *costs.CLIENT_COSTS,
        *report.full_columns(),
        *report.pivot_costs(),
        *board.cells.cost_columns().values(),
        *(m.label for m in declared.values()),
    ]
    symbols = ("alpha", "beta", "gamma", "eq6", "Eq. 6", "α", "β", "γ")
    assert [name for name in generic if any(s in name for s in symbols)] == []
    assert report.pivot_costs() == {
        "MB sent + received / client": "client_MB_exchanged",
        "GFLOPs / client": "client_GFLOPs",
        "peak step MB / client": "peak_step_MB",
    }
    # MFCL's Tab. 3 heads the same columns with the paper's symbols
    assert set(mfcl_tables.TAB3.values()) <= set(declared)
    cost = {"paper_bits": "4.82e+09", "client_GFLOPs": "305", "paper_memory_MB": "7.73"}
    rows = [
        {"experiment": "m", "row": "MFCL(TN)", "column": "S", "method": "mfcl", "linear_top1": 70}
        | cost,
        {"experiment": "f", "row": "FedSimCLR", "column": "S", "method": "fedsimclr"}
        | {"linear_top1": 71, "client_MB_exchanged": "5.28"}
        | cost,
    ]
    tables = report.report_tables(rows)
    assert "| method | α (bits) | β (GFLOPs) | γ Eq. 6 (MB) |" in tables["mfcl_tab3"][1]
    others = {name: text for name, (_, text) in tables.items() if name != "mfcl_tab3"}
    assert "linear" in others and "MB sent + received / client" in others["linear"]
    assert [n for n, text in others.items() if any(s in text for s in symbols)] == []


def test_committed_reports_use_the_generic_cost_names():
    """Every committed report, rendered with the generic names: no row has an old cost column
    and only MFCL's tables show its α, β, γ headers (APFL's mixing weight α is its label)."""
    paper = ("α (bits)", "β (GFLOPs)", "γ Eq. 6")
    for path in sorted(Path("results/reports").glob("*/report.json")):
        saved = json.loads(path.read_text())
        old = {k for r in saved["rows"] for k in r} & set(report.RENAMED)
        assert not old, (path, old)
        shown = [n for n, t in saved["tables"].items() if any(s in t for s in paper)]
        assert all(n.startswith("mfcl_") for n in shown), (path, shown)
    assert {"client_GFLOPs_mean", "client_MB_exchanged_mean"} <= set(
        next(
            iter(
                json.loads(Path("results/reports/benchmark/board.json").read_text())[
                    "lines"
                ].values()
            )
        )
    )


def test_a_report_json_with_the_old_cost_names_loads_with_the_new(tmp_path):
    old = {"experiment": "a", "beta_GFLOPs": "305", "client_MB_sent": "5.28", "alpha_bits": "1"}
    saved = {"pipeline": "p", "rows": [old], "figures": {}, "heatmaps": "h"}
    (tmp_path / "report.json").write_text(json.dumps(saved))
    row = report.load_saved(tmp_path)["rows"][0]
    assert dict(row) == {
        "experiment": "a",
        "client_GFLOPs": "305",
        "client_MB_exchanged": "5.28",
        "paper_bits": "1",
    }
