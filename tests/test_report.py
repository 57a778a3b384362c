"""The generic report: pivot cells, the rows, the short Markdown table beside the full CSV,
rendering the committed reports again, the docs' table blocks, and its vocabulary."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from fedssl import params as P
from fedssl.experiment import experiment_model
from fedssl.methods import registry
from fedssl.reporting.report import (
    columns_of,
    committed_rows,
    failed_run,
    fill_blocks,
    load_saved,
    render,
    report_tables,
    rerender,
    reused_row,
    runs_markdown,
    table_cell,
    untrained_apart,
    write_report,
)
from tests.fixtures import REPO, TINY_MFCL_EXPERIMENT

REPORTS = sorted(p.parent for p in (REPO / "results/reports").glob("*/report.json"))

PART = P.PartitionParams.model_validate(
    {"dataset": "c10", "num_clients": 10, "scheme": {"kind": "dirichlet", "alpha": 0.01}}
)


def mfcl_exp():
    import yaml

    raw = yaml.safe_load(TINY_MFCL_EXPERIMENT.format(norm="gn", secure="false"))
    return experiment_model().model_validate(raw)


MFCL = registry.get("mfcl")


def test_cells_are_method_by_partition_or_by_the_swept_setting():
    assert table_cell(mfcl_exp(), MFCL, PART, "cifar10") == ("MFCL(GN)", "CIFAR-10 ξ=0.01")
    iid = PART.model_copy(update={"scheme": P.IIDScheme()})
    assert table_cell(mfcl_exp(), MFCL, iid, "tiny_imagenet") == ("MFCL(GN)", "Tiny IID")
    many = PART.model_copy(update={"num_clients": 100, "label": "CIFAR-10 ξ=0.01, 100 clients"})
    assert table_cell(mfcl_exp(), MFCL, many, "cifar10")[1] == "CIFAR-10 ξ=0.01, 100 clients"
    assert table_cell(
        mfcl_exp(), MFCL, PART, "cifar10", "method", "method.client_module.channels_per_group"
    ) == ("MFCL(GN)", "channels_per_group=2")
    assert table_cell(mfcl_exp(), MFCL, PART, "cifar10", "title")[0] == mfcl_exp().title
    reference = mfcl_exp().model_copy(update={"title": "Raw pixels"})
    assert table_cell(reference, registry.get("none"), PART, "cifar10")[0] == "Raw pixels"


def row(method, column, acc, sent=""):
    return {
        "row": method,
        "column": column,
        "method": "fedsimclr",
        "linear_top1": acc,
        "client_MB_exchanged": sent,
        "client_GFLOPs": "",
        "peak_step_MB": "",
    }


def test_a_run_that_trained_no_round_is_not_one_more_seed_of_its_methods_line():
    """MFCL's stem at init (0 rounds) shares MFCL(TN)'s label: it becomes a row of its own,
    by its title. A 0-round run alone in its row (a reference method with one title) keeps
    its row, and trained runs never move."""
    rows = [
        {"row": "MFCL(TN)", "title": "MFCL(TN)", "rounds": 50},
        {"row": "MFCL(TN)", "title": "MFCL(TN) stem at init", "rounds": 0},
        {"row": "Gradient leakage", "title": "DLG on LeNet", "rounds": 0},
        {"row": "FedAvg", "title": "fedavg_p", "rounds": 100},
    ]
    titles = {
        "MFCL(TN)": {"MFCL(TN)", "MFCL(TN) stem at init"},
        "Gradient leakage": {"DLG on LeNet"},
        "FedAvg": {"fedavg", "fedavg_p"},
    }
    got = [r["row"] for r in untrained_apart([dict(r) for r in rows], titles)]
    assert got == ["MFCL(TN)", "MFCL(TN) stem at init", "Gradient leakage", "FedAvg"]


def test_the_pivot_puts_methods_down_settings_across_and_costs_beside():
    rows = [
        row("MFCL(TN)", "ξ=0.01", 84.0, "50.3"),
        row("MFCL(TN)", "ξ=0.01", 85.0, "50.3"),
        row("MFCL(TN)", "ξ=200", 85.3, "50.3"),
        row("FedSimCLR", "ξ=200", 81.9),
    ]
    heading, table = report_tables(rows)["linear"]
    lines = table.splitlines()
    assert heading == "Linear probe top-1 %" and "mean ± sample SD over runs" in lines[0]
    assert lines[2] == (
        "| method | ξ=0.01 | ξ=200 | MB sent + received / client | GFLOPs / client "
        "| peak step MB / client |"
    )
    assert lines[4] == "| MFCL(TN) | 84.50±0.71 | 85.30 | 50.3 |  |  |"
    assert lines[5] == "| FedSimCLR |  | 81.90 |  |  |  |"  # no run, no costs: blank cells


def test_every_committed_table_with_sd_cells_names_its_convention():
    conventions = {}
    for folder in REPORTS:
        for name, table in json.loads((folder / "report.json").read_text())["tables"].items():
            cells = [line for line in table.splitlines() if line.startswith("|")]
            if any(re.search(r"\d±\d", line) for line in cells):
                found = re.findall(r"mean ± (sample|population) SD over", table)
                assert len(found) == 1, f"{folder.name}: table {name} does not state its SD"
                conventions[name] = found[0]
    assert conventions["cpcfl_tab3"] == "population" and conventions["linear"] == "sample"


def test_the_markdown_lists_runs_in_a_few_columns_and_the_csv_holds_every_column(tmp_path):
    rows = json.loads((REPO / "results/reports/lw_smoke/report.json").read_text())["rows"]
    write_report(tmp_path, "lw_smoke", rows, {}, "artifacts/reports/lw_smoke")
    header = runs_markdown(rows).splitlines()[2]
    assert header == (
        "| experiment | method | setting | linear | k-NN | fine-tune | "
        "MB up / client | MB down / client | rounds |"
    )
    text = (tmp_path / "report.md").read_text()
    assert "round_MB_up" not in text and "finetune_loss" not in text
    csv_header = (tmp_path / "report.csv").read_text().splitlines()[0].split(",")
    assert csv_header == columns_of(rows) and len(csv_header) > 40
    assert {"round_MB_up", "finetune_loss", "linear_top1"} <= set(csv_header)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["rows"] == rows and "runs" in saved["tables"]


@pytest.mark.parametrize("folder", REPORTS, ids=[f.name for f in REPORTS])
def test_rendering_the_committed_rows_gives_the_committed_report(folder, monkeypatch):
    """The report stage and `python -m fedssl.reporting.report render` share one renderer: the
    rows of each committed report.json render to its committed report.md and tables."""
    monkeypatch.chdir(REPO)  # a method's tables may read its committed step results
    saved = load_saved(folder)
    text, tables = render(
        saved["pipeline"],
        saved["rows"],
        saved["figures"],
        saved["heatmaps"],
        saved.get("failed", []),
        saved.get("pending", []),  # a partial board's runs not made yet
    )
    assert text == (folder / "report.md").read_text(), (
        f"{folder.name}: stale, run `python -m fedssl.reporting.report render {folder.name}`"
    )
    assert tables == saved["tables"]


def test_rerendering_a_report_rewrites_the_same_files(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    source = REPO / "results/reports/mpfedcon_smoke"
    shutil.copytree(source, tmp_path / "mpfedcon_smoke")
    rerender(tmp_path / "mpfedcon_smoke")
    for name in ("report.md", "report.csv", "report.json"):
        assert (tmp_path / "mpfedcon_smoke" / name).read_bytes() == (source / name).read_bytes()
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report.json").write_text('{"pipeline": "old", "rows": []}')
    with pytest.raises(KeyError, match="lacks figures, heatmaps"):
        rerender(tmp_path / "old")


def test_the_generic_report_speaks_no_papers_vocabulary():
    """A paper's terms (its table and equation numbers, its α / β / γ, its method names) live
    in its plugin; the generic report and its helpers name none."""
    papers = (
        "Tab.",
        "Eq.",
        "Fig.",
        "α",
        "β",
        "γ",
        "MFCL",
        "CP-CFL",
        "LW-FedSSL",
        "MocoSFL",
        "MpFedcon",
        "FedSimCLR",
    )
    for module in (
        "fedssl/reporting/report.py",
        "fedssl/reporting/formatting.py",
        "fedssl/evaluations/costs.py",
    ):
        text = (REPO / module).read_text()
        assert [w for w in papers if w in text] == [], module


def test_mfcl_lays_out_its_costs_and_rserver_loss_in_its_own_tables():
    rows = [
        {
            "method": "mfcl",
            "row": "MFCL(TN)",
            "column": "c",
            "paper_bits": "4.82e+09",
            "client_GFLOPs": "305",
            "paper_memory_MB": "7.73",
            "client_MB_exchanged": "50.3",
            "rserver_final_loss": 4.5,
        },
        {
            "method": "fedsimclr",
            "row": "FedSimCLR",
            "column": "c",
            "paper_bits": "1.26e+08",
            "client_GFLOPs": "718",
            "paper_memory_MB": "197",
            "client_MB_exchanged": "5.28",
        },
        {"method": "none", "row": "Raw pixels", "column": "c"},
    ]
    tables = MFCL.tables(rows)
    assert list(tables) == ["mfcl_tab3", "mfcl_rserver_loss"]
    assert tables["mfcl_tab3"].splitlines()[2:] == [
        "| method | α (bits) | β (GFLOPs) | γ Eq. 6 (MB) | sent + received (MB) |",
        "|---|---|---|---|---|",
        "| MFCL(TN) | 4.82e+09 | 305 | 7.73 | 50.3 |",
        "| FedSimCLR | 1.26e+08 | 718 | 197 | 5.28 |",
    ]
    assert "| MFCL(TN) | 4.50 |" in tables["mfcl_rserver_loss"]
    assert MFCL.tables(rows[1:]) == {}  # no MFCL run: no MFCL table


def test_page_tables_are_refilled_from_the_committed_reports(tmp_path):
    report = tmp_path / "demo" / "report.json"
    report.parent.mkdir()
    report.write_text('{"tables": {"linear": "| a |\\n|---|\\n| 1 |\\n"}}')
    text = "intro\n<!-- results: demo linear -->\nold table\n<!-- /results -->\nend\n"
    assert fill_blocks(text, tmp_path) == (
        "intro\n<!-- results: demo linear -->\n| a |\n|---|\n| 1 |\n<!-- /results -->\nend\n"
    )
    with pytest.raises(KeyError, match="no table 'knn'"):
        fill_blocks(text.replace("linear", "knn"), tmp_path)
    with pytest.raises(FileNotFoundError, match="pipeline 'other'"):
        fill_blocks(text.replace("demo", "other"), tmp_path)


def test_a_row_holds_the_metrics_its_method_steps_wrote(tmp_path):
    """A step may write a metrics.json into its output (split learning's misalignment and
    traffic, an attack's error): its entries join the experiment's report row; the
    evaluation's metrics win a name clash."""
    from fedssl.reporting.report import experiment_row

    steps = []
    for name, metrics in (
        ("pretrain", {"mis_after_sync_mean": 0.5, "knn_top1": -1}),
        ("attack", {"inversion_mse": 0.02}),
    ):
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


def test_cpcfl_tables_use_the_population_sd_as_its_paper_and_say_so():
    from fedssl.methods.cpcfl.tables import paper_tables

    rows = [
        {"method": "cpcfl", "row": "CP-CFL", "column": "c", "personal_at_10": acc, "f1_macro": f1}
        for acc, f1 in ((60.0, 0.5), (70.0, 0.7))
    ]
    tables = paper_tables(rows)
    # two trials 10 apart: population SD 5 (a sample SD would be 7.07)
    assert "| CP-CFL | 65.00±5.00 |" in tables["cpcfl_tab3"]
    assert "| CP-CFL | 0.6000±0.1000 |" in tables["cpcfl_tab4"]
    assert all("mean ± population SD over trials" in t for t in tables.values())


def _identity(saved: dict, **changes) -> dict:
    return {**{k: saved[k] for k in ("title", "partition", "method", "arch")}, **changes}


def test_a_workspace_without_a_runs_outputs_can_take_its_committed_row(tmp_path):
    """`stages.report --reuse-committed`: the committed row, in this report's cell, its source
    named in the row and in the report's text; a preset that changed since gets no row."""
    shutil.copytree(REPO / "results/reports/mpfedcon_smoke", tmp_path / "mpfedcon_smoke")
    shutil.copytree(REPO / "results/reports/mpfedcon_leakage", tmp_path / "mpfedcon_leakage")
    assert committed_rows("", tmp_path)["mpf_smoke_fedavg_s5_seed0"]["source"] == "mpfedcon_leakage"
    committed = committed_rows("mpfedcon_smoke", tmp_path)  # its own report first
    assert committed["mpf_smoke_fedavg_s5_seed0"]["source"] == "mpfedcon_smoke"
    saved = load_saved(tmp_path / "mpfedcon_smoke")["rows"][0]
    name = saved["experiment"]
    now = _identity(saved, row="new row", column="new column")
    row = reused_row(name, now, committed)
    assert row["source"] == "mpfedcon_smoke"
    assert (row["row"], row["column"]) == ("new row", "new column")
    assert row["personal_top1"] == saved["personal_top1"]
    assert row.step_results == {
        k: str(v) for k, v in saved.step_results.items()
    }  # the method's tables read its committed round logs from there
    text, _ = render("p", [row, {**row, "source": ""}], {}, "heat")
    assert "1 of the 2 rows are committed rows of earlier runs, not rerun" in text
    assert "`mpfedcon_smoke` (1 runs)" in text
    with pytest.raises(ValueError, match="no longer matches its preset in arch"):
        reused_row(name, _identity(saved, arch="other", row="r", column="c"), committed)
    with pytest.raises(FileNotFoundError, match="no committed report has its row"):
        reused_row("never_run", now, committed)


def test_a_run_that_stopped_with_an_error_is_listed_with_it(tmp_path):
    """A diverged run has no row; the report names it with its stage's last error line, and
    a rerender keeps the list."""
    (tmp_path / "train__x.log").write_text(
        "round 19/30: loss 8.3\nerror: the loss is nan at round 20\n"
    )
    (tmp_path / "personal__y.log").write_text("round 30/30: loss 0.1\n")
    assert failed_run("y", ["personal__y"], tmp_path) is None
    stopped = failed_run("x", ["partition__p", "train__x"], tmp_path)
    assert stopped == {
        "experiment": "x",
        "stage": "train__x",
        "error": "the loss is nan at round 20",
    }
    source = REPO / "results/reports/mpfedcon_smoke"
    saved = load_saved(source)
    write_report(tmp_path / "r", "p", saved["rows"][:2], {}, "heat", [stopped])
    text = (tmp_path / "r" / "report.md").read_text()
    assert "| x | train__x | the loss is nan at round 20 |" in text
    rerender(tmp_path / "r")
    assert (tmp_path / "r" / "report.md").read_text() == text


def test_a_failed_runs_curve_joins_its_line_where_its_record_names_its_cell():
    """A run that stopped with an error has no row; its failure record's cell puts its curve
    in its line's panel (with the encoder suffix its row label takes), and an older record
    without a cell is left to the fallback by its seeds' label."""
    from fedssl.reporting.report import curve_labels

    rows = [
        {"experiment": "a_s0", "row": "A", "column": "IID", "arch": "cnn"},
        {"experiment": "a_vit_s0", "row": "A", "column": "IID", "arch": "vit"},
    ]
    failed = [
        {"experiment": "a_lr2_s0", "stage": "train__a_lr2_s0", "error": "the loss is nan",
         "row": "A", "column": "IID", "arch": "cnn"},
        {"experiment": "b_s1", "stage": "train__b_s1", "error": "the loss is nan"},
    ]  # fmt: skip
    assert curve_labels(rows + failed) == {
        "a_s0": ("A · cnn", "IID"), "a_vit_s0": ("A · vit", "IID"), "a_lr2_s0": ("A · cnn", "IID")
    }  # fmt: skip


def test_a_pending_runs_half_made_log_is_no_curve(tmp_path, monkeypatch):
    """A run not made yet whose training was stopped half-way has a round log in the
    workspace but no row: the curves leave it out (it would stop short of its line and, with
    no cell, draw a panel of its own), while a made run's log is read in stage order."""
    from types import SimpleNamespace

    from fedssl.reporting.report import round_logs

    monkeypatch.chdir(tmp_path)
    stages = {
        f"{kind}__{run}": SimpleNamespace(
            out=f"artifacts/experiments/{run}/{kind}", plots=[f"logs/{kind}_{run}.tsv"]
        )
        for run in ("a_s0", "a_s1")
        for kind in ("grow1", "grow2")
    }
    dag = SimpleNamespace(
        experiments=["a_s0", "a_s1"],
        of_experiment={r: [f"grow1__{r}", f"grow2__{r}"] for r in ("a_s0", "a_s1")},
        stages=stages,
    )
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs/grow1_a_s1.tsv").write_text("round\tloss\n1\t0.5\n")
    made = [Path(f"results/experiments/a_s0/{k}_a_s0.tsv") for k in ("grow1", "grow2")]
    half = [Path("logs/grow1_a_s1.tsv"), Path("results/experiments/a_s1/grow2_a_s1.tsv")]
    assert round_logs(dag) == {"a_s0": made, "a_s1": half}
    assert round_logs(dag, pending=["a_s1"]) == {"a_s0": made}


def test_a_report_made_part_by_part_lists_the_runs_not_made_yet(tmp_path):
    """`stages.report --reuse-committed --partial` (a board run over several sessions): the
    experiments without outputs or committed rows are named, not in the rows, and a rerender
    keeps them; --partial alone is refused before anything is read."""
    from stages.report import run as report_stage

    saved = load_saved(REPO / "results/reports/mpfedcon_smoke")
    write_report(tmp_path / "r", "p", saved["rows"][:2], {}, "heat", [], ["b_s1", "c_s0"])
    text = (tmp_path / "r" / "report.md").read_text()
    assert "## Not run yet (2 experiments, not in the tables above)\n\n`b_s1`, `c_s0`" in text
    assert load_saved(tmp_path / "r")["pending"] == ["b_s1", "c_s0"]
    rerender(tmp_path / "r")
    assert (tmp_path / "r" / "report.md").read_text() == text
    write_report(tmp_path / "q", "p", saved["rows"][:2], {}, "heat")
    assert "Not run yet" not in (tmp_path / "q" / "report.md").read_text()
    with pytest.raises(SystemExit):
        report_stage(["benchmark", "--partial"])


def test_a_report_made_part_by_part_keeps_an_earlier_sessions_failed_runs(tmp_path):
    """A run that stopped with an error in an earlier session (its log gone with that
    workspace) stays a failure in the next session's report, not a run not made yet."""
    from fedssl.reporting.report import committed_failures

    saved = load_saved(REPO / "results/reports/mpfedcon_smoke")
    stopped = {"experiment": "b_s0", "stage": "train__b_s0", "error": "the loss is nan"}
    write_report(tmp_path / "p", "p", saved["rows"][:2], {}, "heat", [stopped], ["c_s1"])
    assert committed_failures("p", root=tmp_path) == {"b_s0": stopped}
    assert committed_failures("q", root=tmp_path) == {}  # no committed report: none


def test_a_report_reusing_committed_rows_needs_no_heatmap_of_an_earlier_workspace(tmp_path):
    """A fresh workspace that made one partition of a board: the report copies that one's
    heat-map and leaves out the others', which only a reusing report may do."""
    from types import SimpleNamespace

    from stages.report import copy_heatmaps

    (tmp_path / "made").mkdir()
    (tmp_path / "made" / "heatmap.png").write_bytes(b"png")
    dag = SimpleNamespace(
        stages={f"partition__{p}": SimpleNamespace(out=str(tmp_path / p)) for p in ("made", "gone")}
    )
    (tmp_path / "out").mkdir()
    copy_heatmaps(dag, ["made", "gone"], tmp_path / "out", missing_ok=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["partition_made.png"]
    with pytest.raises(FileNotFoundError):
        copy_heatmaps(dag, ["made", "gone"], tmp_path / "out")


def test_a_run_is_made_here_once_every_stage_and_its_metrics_are(tmp_path):
    """A trained run whose evaluation has not run yet (or whose metrics were removed) is not
    made: the partial report lists it as not run yet instead of reading missing files."""
    from types import SimpleNamespace

    from stages.report import made_here

    def stage(kind, metrics=()):
        return SimpleNamespace(
            out=str(tmp_path / kind), metrics=[str(tmp_path / m) for m in metrics]
        )

    stages = [stage("pretrain"), stage("evaluate", ["metrics.json"])]
    (tmp_path / "pretrain").mkdir()
    (tmp_path / "pretrain" / "meta.json").write_text("{}")
    assert not made_here(stages)  # trained, not evaluated
    (tmp_path / "evaluate").mkdir()
    (tmp_path / "evaluate" / "meta.json").write_text("{}")
    assert not made_here(stages)  # evaluated, but its metrics are gone
    (tmp_path / "metrics.json").write_text("{}")
    assert made_here(stages)
