"""The report's pivot table (MFCL Tab. 2 layout, Tab. 3 cost columns)."""
from __future__ import annotations

import pytest

from fedssl import params as P
from fedssl.experiment import experiment_model
from fedssl.methods import registry
from fedssl.report import pivot_markdown, readme_text, table_cell
from tests.fixtures import TINY_MFCL_EXPERIMENT

PART = P.PartitionParams.model_validate(
    {"dataset": "c10", "num_clients": 10, "scheme": {"kind": "dirichlet", "alpha": 0.01}})


def mfcl_exp():
    import yaml
    raw = yaml.safe_load(TINY_MFCL_EXPERIMENT.format(norm="gn", secure="false"))
    return experiment_model().model_validate(raw)


MFCL = registry.get("mfcl")


def test_cells_are_method_by_partition_or_by_the_swept_setting():
    assert table_cell(mfcl_exp(), MFCL, PART, "cifar10") == ("MFCL(GN)", "CIFAR-10 ξ=0.01")
    iid = PART.model_copy(update={"scheme": P.IIDScheme()})
    assert table_cell(mfcl_exp(), MFCL, iid, "tiny_imagenet") == ("MFCL(GN)", "Tiny IID")
    assert table_cell(mfcl_exp(), MFCL, PART, "cifar10", "method",
                      "method.client_module.channels_per_group") == ("MFCL(GN)",
                                                                     "channels_per_group=2")
    assert table_cell(mfcl_exp(), MFCL, PART, "cifar10", "title")[0] == mfcl_exp().title
    reference = mfcl_exp().model_copy(update={"title": "Raw pixels"})
    assert table_cell(reference, registry.get("none"), PART, "cifar10")[0] == "Raw pixels"


def row(method, column, acc, alpha=""):
    return {"row": method, "column": column, "linear_top1": acc, "alpha_bits": alpha,
            "beta_GFLOPs": "", "gamma_eq6_MB": "", "client_MB_sent": ""}


def test_pivot_puts_methods_down_partitions_across_and_averages_repeats():
    rows = [row("MFCL(TN)", "ξ=0.01", 84.0, "2.5e+11"), row("MFCL(TN)", "ξ=0.01", 85.0, "2.5e+11"),
            row("MFCL(TN)", "ξ=200", 85.3, "2.5e+11"), row("FedSimCLR", "ξ=200", 81.9)]
    lines = pivot_markdown(rows, "linear_top1").splitlines()
    assert lines[0].split(" | ")[:3] == ["| method", "ξ=0.01", "ξ=200"]
    tn = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert tn[:4] == ["MFCL(TN)", "84.50±0.71", "85.30", "2.5e+11"]
    fed = [c.strip() for c in lines[3].split("|")[1:-1]]
    assert fed[:4] == ["FedSimCLR", "", "81.90", ""]  # no run, no costs stage: blank cells
    assert "α (bits)" not in pivot_markdown(rows, "linear_top1", costs=False)


def test_readme_tables_are_refilled_from_the_committed_reports(tmp_path):
    report = tmp_path / "demo" / "report.json"
    report.parent.mkdir()
    report.write_text('{"tables": {"linear": "| a |\\n|---|\\n| 1 |\\n"}}')
    text = "intro\n<!-- results: demo linear -->\nold table\n<!-- /results -->\nend\n"
    assert readme_text(text, tmp_path) == ("intro\n<!-- results: demo linear -->\n| a |\n|---|\n"
                                           "| 1 |\n<!-- /results -->\nend\n")
    with pytest.raises(KeyError, match="no table 'knn'"):
        readme_text(text.replace("linear", "knn"), tmp_path)
    with pytest.raises(FileNotFoundError, match="pipeline 'other'"):
        readme_text(text.replace("demo", "other"), tmp_path)


def test_the_readme_matches_the_committed_reports(monkeypatch):
    from tests.fixtures import REPO
    monkeypatch.chdir(REPO)
    text = (REPO / "README.md").read_text()
    assert "<!-- results:" in text
    assert readme_text(text) == text, "README.md is stale: run `python -m fedssl.report readme`"


def test_a_row_holds_the_metrics_its_method_steps_wrote(tmp_path):
    """A step may write a metrics.json into its output (split learning's misalignment and
    traffic, an attack's error): its entries join the experiment's report row; the
    evaluation's metrics win a name clash."""
    import json
    from fedssl.report import experiment_row
    steps = []
    for name, metrics in (("pretrain", {"mis_after_sync_mean": 0.5, "knn_top1": -1}),
                          ("attack", {"inversion_mse": 0.02})):
        d = tmp_path / name
        d.mkdir()
        (d / "meta.json").write_text(json.dumps({"wall_seconds": 2.0, "rounds": 3}))
        (d / "metrics.json").write_text(json.dumps(metrics))
        steps.append(d)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "meta.json").write_text(json.dumps({"wall_seconds": 1.0}))
    evaluation = tmp_path / "metrics.json"
    evaluation.write_text(json.dumps({"linear_top1": 80.0, "knn_top1": 70.0}))
    row = experiment_row("exp", mfcl_exp(), MFCL, [*steps, tmp_path / "plain"], evaluation, None)
    assert row["mis_after_sync_mean"] == 0.5 and row["inversion_mse"] == 0.02
    assert row["knn_top1"] == 70.0 and row["linear_top1"] == 80.0
    assert row["rounds"] == 6 and "train_s" not in row  # wall times stay in run records


def test_methods_draw_no_figures_unless_they_say_so(tmp_path):
    assert MFCL.figures([{"method": "mfcl"}], tmp_path) == {}
    assert list(tmp_path.iterdir()) == []


def test_a_numeric_sweep_reads_in_value_order_whatever_the_listing_order():
    from stages.report import in_column_order
    rows = [{"e": "fedavg"}, {"e": "n2"}, {"e": "n5"}, {"e": "n3"}]
    assert [r["e"] for r in in_column_order(rows, [1, 2, 5, 3])] == ["fedavg", "n2", "n3", "n5"]
    # ties keep the listing order; a value that is not a number (None = "all epochs", or a
    # flag) leaves the listing order alone
    assert [r["e"] for r in in_column_order(rows, [8, 4, 8, 4])] == ["n2", "n3", "fedavg", "n5"]
    assert in_column_order(rows, [None, 0, 0, None]) == rows
    assert in_column_order(rows, [True, False, True, False]) == rows
