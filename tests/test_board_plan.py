"""The third board's design as the presets write it (issue 51): each run's seed draws its
partition, n = 10 on ξ = 0.1 for the small-CNN lines and 5 elsewhere, every trained line swept
at the same three learning rates, the supervised lines at their twin's init; and its plan's
estimates from the first board's measured runs."""

from __future__ import annotations

import collections
import json

import pytest

from fedssl.presets import Presets
from fedssl.reporting.board import plan, tuning

BOARD = "board2"
SMALL_CNN = ("fedsimclr", "fedbyol", "fedema", "fedu", "orchestra", "featarc", "random_init",
             "fedavg", "fedprox", "moon")  # fmt: skip


@pytest.fixture(scope="module")
def presets():
    return Presets()


@pytest.fixture(scope="module")
def runs(presets):
    return {e: presets.load("experiment", e) for e in presets.pipeline_experiments(BOARD)}


def _line(name: str) -> str:
    """A board run's line: ``board2_m100_fedsimclr_lrh_dir01_s3`` -> ``fedsimclr`` (its
    partition, seed and sweep label dropped)."""
    return tuning.line_of(name.replace("_m100_", "_").rsplit("_", 2)[0] + tuning.SWEEP_RUN)[7:]


def test_every_run_draws_the_partition_its_seed_names(runs, presets):
    for name, exp in runs.items():
        draw = presets.load("partition", exp.partition)
        assert name.endswith(f"_s{exp.method.seed}") and draw.seed == exp.method.seed, name
        assert draw.client_tests.per_client >= 200, name


def test_runs_per_line_and_partition(runs):
    count = collections.Counter(
        (_line(n), "m100" if "_m100_" in n else n.rsplit("_", 2)[1]) for n in runs
    )
    for (line, partition), n in count.items():
        expected = 10 if line in SMALL_CNN and partition == "dir01" else 5
        assert n == expected, (line, partition)
    assert {p for _, p in count} == {"dir01", "shards2", "m100"}


def test_every_trained_line_is_swept_at_half_and_twice_its_lr(presets, runs):
    """The equal tuning budget: the two other points of each trained line's sweep exist and
    differ from its own dir01_s0 run in the learning rate alone."""
    from fedssl.params import federation_of

    tuned = set(presets.pipeline_experiments("board2_tune_cnn"))
    tuned |= set(presets.pipeline_experiments("board2_tune_rest"))
    blocks = {n: federation_of(e.method) for n, e in runs.items() if n.endswith("_dir01_s0")}
    trained = {tuning.line_of(n) for n, b in blocks.items() if b and b.rounds and "_m100_" not in n}
    assert len(trained) == 32
    for line in trained:  # its sweep's centre: the line at its starting rate
        own = f"{line}_dir01_s0"
        block = federation_of(presets.load("experiment", own).method)
        assert own in tuned, own
        for label, factor in (("lrh", 0.5), ("lr2", 2.0)):
            point = presets.load("experiment", f"{line}_{label}_dir01_s0")
            assert federation_of(point.method).lr == pytest.approx(factor * block.lr), line
            assert f"{line}_{label}_dir01_s0" in tuned


def test_each_tuned_line_runs_every_run_at_the_rate_its_sweep_chose(presets, runs):
    """The committed tuning (results/reports/board2/tuning.json) is what the parts run: a
    line whose sweep is settled (every point scored or diverged, none beyond an edge still
    due) runs at the chosen rate on every partition, 100 clients included."""
    from pathlib import Path

    def is_settled(row):
        every_point_ran = all(acc is not None or lr in row["diverged"] for lr, acc in row["points"])
        return every_point_ran and not row["why"].endswith("is due")

    rows = json.loads(Path("results/reports/board2/tuning.json").read_text())
    settled = {r["line"].removeprefix("board2_"): r["chosen"] for r in rows if is_settled(r)}
    assert len(settled) >= 10
    checked = collections.Counter()
    for name in runs:
        if (line := _line(name)) in settled:
            assert tuning.learning_rate(name, presets) == pytest.approx(settled[line]), name
            checked[line] += 1
    assert set(checked) == set(settled)


def test_the_supervised_lines_start_from_their_twins_encoder(runs):
    sup = [e for e in runs.values() if e.method.name == "supervised"]
    assert len(sup) == 45 + 15 and all(e.method.init == "encoder" for e in sup)


def test_a_run_is_estimated_from_its_first_board_line_scaled_by_its_rounds_images(presets):
    assert plan.origin("board2_fedsimclr_lrh_dir01_s0", presets) == "board_fedsimclr_dir01_s0"
    measured = {
        "board_fedsimclr_dir01_s0": {"pretrain": 300.0, "features": 60.0},
        "board_fedsimclr_shards2_s1": {"pretrain": 420.0, "features": 60.0},
    }
    rounds = {"pretrain"}
    assert plan.run_minutes("board2_fedsimclr_dir01_s4", presets, measured, rounds) == 7.0
    # 100 clients, 10 a round, 20,000 images: a round trains 2,000 images where it trained 6,000
    assert plan.run_minutes("board2_m100_fedsimclr_dir01_s0", presets, measured, rounds) == (
        pytest.approx((360 / 3 + 60) / 60)
    )


def test_what_is_left_is_estimated_from_the_boards_own_runs_of_a_line_first(
    presets, tmp_path, monkeypatch
):
    """FeatARC at 100 clients measured twice (its pretraining and features: 15 and 17
    minutes) is a line of 16 minutes a run, whatever its seed; a run whose record lacks its
    rounds stage (only its features) is not trusted; ``left`` takes the board's own figure
    before the first board's scaled one."""
    record = {
        "pretrain__board2_m100_featarc_dir01_s1": 878.0,
        "features__board2_m100_featarc_dir01_s1": 22.0,
        "pretrain__board2_m100_featarc_dir01_s2": 1000.0,
        "features__board2_m100_featarc_dir01_s2": 20.0,
        "features__board2_m100_fedbyol_dir01_s0": 5.0,
    }
    (tmp_path / BOARD).mkdir()
    (tmp_path / BOARD / "stage_runs.json").write_text(
        json.dumps({k: {"stage": k, "wall_seconds": v} for k, v in record.items()})
    )
    got = plan.board_minutes(BOARD, presets, {"pretrain", "train"}, tmp_path)
    assert got == {"b2_m100_cnn:featarc": pytest.approx(16.0)}
    monkeypatch.setattr(plan, "landed", lambda name, dag: False)
    hours = float(plan.left(["board2_p4"], 1000, presets).split(", ")[1].split(" CPU h")[0])
    monkeypatch.setattr(plan, "board_minutes", lambda *a: {"b2_m100_cnn:featarc": 600.0})
    more = float(plan.left(["board2_p4"], 1000, presets).split(", ")[1].split(" CPU h")[0])
    assert more > hours + 5 * (600 - 60) / 60  # five FeatARC runs, each under an hour before


def test_the_plan_counts_each_run_once(presets):
    parts = plan.parts_of(BOARD, presets)
    assert parts[:3] == ["board2_tune_cnn", "board2_tune_rest", "board2_tune_edge"]
    rows = plan.plan(parts, presets)
    every = set(presets.pipeline_experiments(BOARD))
    for part in parts[:3]:
        every |= set(presets.pipeline_experiments(part))
    assert sum(r["runs"] for r in rows) == len(every)


# ------------------------------------------------------------------ the tuning
def _metrics(results, name, **values):
    (results / name).mkdir(parents=True)
    (results / name / "metrics.json").write_text(json.dumps(values))


def test_a_line_keeps_the_rate_that_scores_best_on_validation_never_test(presets, tmp_path):
    from fedssl.reporting.board import tuning

    _metrics(tmp_path, "board2_fedsimclr_dir01_s0", linear_top1=90.0, linear_top1_val=70.0)
    _metrics(tmp_path, "board2_fedsimclr_lrh_dir01_s0", linear_top1=10.0, linear_top1_val=71.5)
    _metrics(tmp_path, "board2_fedsimclr_lr2_dir01_s0", linear_top1=99.0)  # no validation
    _metrics(tmp_path, "board2_solo_lr2_dir01_s0", personal_top1_val=80.0)
    found = tuning.sweeps(["board2_tune_cnn", "board2_tune_rest"], presets, tmp_path)
    assert found["board2_fedsimclr"] == {0.001: 71.5, 0.002: 70.0, 0.004: None}
    assert tuning.choose(found["board2_fedsimclr"], 0.002) == (
        0.001,
        "2 of 3 scored; best at the smallest rate: one point beyond it is due",
    )
    with_extra = {0.0005: 71.0} | found["board2_fedsimclr"]
    assert tuning.choose(with_extra, 0.002) == (0.001, "3 of 4 scored")
    assert tuning.choose({0.0005: 72.0} | found["board2_fedsimclr"], 0.002)[1].endswith(
        "best at the smallest rate after the extra point"
    )
    # the extra point swept below, the best at the largest of the first three: still due
    other_side = {0.0005: 60.0, 0.001: 70.0, 0.002: 71.0, 0.004: 72.0}
    assert tuning.choose(other_side, 0.002)[1].endswith("one point beyond it is due")
    assert tuning.choose(found["board2_solo"], 0.05) == (0.1, "1 of 3 scored")
    assert tuning.choose({0.01: 5.0, 0.02: 5.0, 0.005: 5.0}, 0.01)[0] == 0.01  # a tie: the start
    assert tuning.choose({0.02: 5.0, 0.005: 5.0, 0.01: None}, 0.01)[0] == 0.005
    assert tuning.choose(found["board2_fedbyol"], 0.002) == (
        0.002,
        "untuned: no run of the sweep scored",
    )


def _report_failing(reports, pipeline, *experiments):
    """A committed report of ``pipeline`` that lists ``experiments`` as stopped with an error."""
    (reports / pipeline).mkdir(parents=True)
    failed = [{"experiment": e, "stage": f"train__{e}", "error": "the loss is nan"}
              for e in experiments]  # fmt: skip
    saved = {"pipeline": pipeline, "rows": [], "figures": {}, "heatmaps": "", "failed": failed}
    (reports / pipeline / "report.json").write_text(json.dumps(saved))


def test_a_settled_line_is_decided_once_though_a_run_of_its_sweep_is_made_again(presets, tmp_path):
    """Rewriting the tuning keeps a settled line's committed scores and choice (a run made
    again on another machine scores otherwise); a line not settled yet takes the new scores."""
    from fedssl.reporting.board import tuning

    results, folder = tmp_path / "results", tmp_path / "board2"
    scores = {"board2_fedbyol_lrh_dir01_s0": 72.0, "board2_fedbyol_dir01_s0": 75.0,
              "board2_fedbyol_lr2_dir01_s0": 74.0, "board2_fedema_dir01_s0": 70.0}  # fmt: skip
    for name, val in scores.items():
        _metrics(results, name, linear_top1_val=val)
    tuning.write_tuning("board2", presets, results, folder)
    (results / "board2_fedbyol_dir01_s0" / "metrics.json").write_text('{"linear_top1_val": 73}')
    (results / "board2_fedema_dir01_s0" / "metrics.json").write_text('{"linear_top1_val": 71}')
    tuning.write_tuning("board2", presets, results, folder)
    rows = {r["line"]: r for r in json.loads((folder / "tuning.json").read_text())}
    assert rows["board2_fedbyol"]["chosen"] == 0.002  # 0.004 would win on the new score
    assert dict(map(tuple, rows["board2_fedbyol"]["points"]))[0.002] == 75.0
    assert (
        "| board2_fedbyol | 0.001: 72.00, 0.002: 75.00, 0.004: 74.00 |"
        in (folder / "tuning.md").read_text()
    )
    assert dict(map(tuple, rows["board2_fedema"]["points"]))[0.002] == 71.0  # not settled


def test_a_diverged_tuning_run_scores_nothing_and_the_table_says_so(presets, tmp_path):
    from fedssl.reporting.board import tuning

    results, reports = tmp_path / "results", tmp_path / "reports"
    _metrics(results, "board2_solo_dir01_s0", personal_top1_val=80.0)
    _metrics(results, "board2_solo_lrh_dir01_s0", personal_top1_val=82.0)
    _report_failing(reports, "board2_tune_rest", "board2_solo_lr2_dir01_s0")
    rows = {r["line"]: r for r in tuning.tuning_table(["board2_tune_rest"], presets, results,
                                                      reports)}  # fmt: skip
    solo = rows["board2_solo"]
    assert solo["diverged"] == [0.1] and solo["points"][0.1] is None
    assert (solo["chosen"], solo["why"]) == (0.025, "2 of 3 scored; best at the smallest rate: "
                                             "one point beyond it is due")  # fmt: skip
    text = tuning.tuning_markdown(list(rows.values()))
    assert "| board2_solo | 0.025: 82.00, 0.05: 80.00, 0.1: diverged |" in text
    assert "| board2_fedper | 0.025: —, 0.05: —, 0.1: — |" in text  # not run is not diverged


def test_left_skips_what_landed_and_what_its_report_lists_as_stopped(
    presets, tmp_path, monkeypatch
):
    from fedssl.plan.dag import Dag

    monkeypatch.setattr("fedssl.reporting.report.REPORTS", tmp_path / "reports")
    stopped = "board2_solo_lr2_dir01_s0"
    _report_failing(tmp_path / "reports", "board2_tune_rest", stopped)
    dag = Dag("board2_tune_rest", presets=presets)
    open_runs = [e for e in dag.experiments if not plan.landed(e, dag)]
    assert stopped in open_runs
    text = plan.left(["board2_tune_rest"], 0.5, presets)
    head, *batches = text.splitlines()
    assert head.startswith(f"board2_tune_rest: {len(open_runs) - 1} of 66 runs left")
    assert head.endswith("(1 stopped with an error, as its report says)")
    assert f"{stopped} " not in text and batches
    for line in batches:
        assert line.endswith("--keep-going") and "fedssl run board2_tune_rest " in line


def test_a_run_a_board_part_reports_has_landed_only_once_a_committed_report_holds_its_row(
    presets, tmp_path, monkeypatch
):
    """A tuning part's run needs only its metrics (the sweep reads them); a run a board part
    reports also needs a committed row, else it is left, under that part, not the tuning one."""
    reports = tmp_path / "reports"
    monkeypatch.setattr("fedssl.reporting.report.REPORTS", reports)
    monkeypatch.setattr(plan, "landed", lambda name, dag: True)  # every metrics file is here
    tuned, board = set(presets.pipeline_experiments("board2_tune_cnn")), "board2_p1"
    reported = set(presets.pipeline_experiments(board))
    shared = "board2_fedbyol_dir01_s0"
    assert shared in tuned & reported and len(tuned - reported) > 0

    def heads():
        return [line for line in plan.left(["board2_tune_cnn", board], 1000, presets)
                .splitlines() if not line.startswith("  ")]  # fmt: skip

    tune, part = heads()
    k = len(tuned & reported)
    assert tune == (f"board2_tune_cnn: 0 of 30 runs left, 0.0 CPU h ({k} left under the parts "
                    "that report them: no committed report holds their rows)")  # fmt: skip
    assert part.startswith(f"{board}: {len(reported)} of {len(reported)} runs left")
    (reports / board).mkdir(parents=True)
    saved = {"pipeline": board, "rows": [{"experiment": shared}], "figures": {}, "heatmaps": ""}
    (reports / board / "report.json").write_text(json.dumps(saved))
    tune, part = heads()
    assert f"({k - 1} left under" in tune
    assert part.startswith(f"{board}: {len(reported) - 1} of {len(reported) - 1} runs left")
    assert shared not in plan.left([board], 1000, presets)


def test_the_committed_plan_is_the_presets_plan(presets):
    """results/reports/board2/plan.md (which the board's page cites) is what the presets and
    the first board's measured stages give now: regenerate it after changing either
    (`python -m fedssl.reporting.board plan board2 > results/reports/board2/plan.md`)."""
    from pathlib import Path

    committed = Path("results/reports/board2/plan.md").read_text()
    assert committed == plan.plan_markdown(plan.plan(plan.parts_of(BOARD, presets), presets)) + "\n"


def test_the_committed_hours_spent_are_what_the_kept_records_give(presets):
    """results/reports/board2/spent.md (the board's page cites it) is what the committed run
    records and results give now: regenerate it with each batch's results
    (`python -m fedssl.reporting.board plan board2 --spent > results/reports/board2/spent.md`)."""
    from pathlib import Path

    committed = Path("results/reports/board2/spent.md").read_text()
    assert committed == plan.spent(BOARD, presets) + "\n"


def test_the_board_states_each_lines_rate_and_whether_its_sweep_chose_it(presets, tmp_path):
    """The ``lr, tuning`` column: tuned only where every run uses the rate its sweep chose (a
    line whose grid still holds the starting rate is untuned, and says what was chosen); the
    100-client line reads the sweep of its method and encoder; references have no rate to tune."""
    from fedssl.reporting.board import tuning
    from fedssl.reporting.board.cells import line_label
    from fedssl.reporting.board.tables import table

    results, folder = tmp_path / "results", tmp_path / "board2"
    _metrics(results, "board2_fedsimclr_dir01_s0", linear_top1_val=70.0)
    _metrics(results, "board2_fedsimclr_lrh_dir01_s0", linear_top1_val=71.5)  # 0.001 wins
    _metrics(results, "board2_fedavg_dir01_s0", linear_top1_val=80.0)  # the start wins
    _metrics(results, "board2_fedavg_lr2_dir01_s0", linear_top1_val=79.0)
    tuning.write_tuning("board2", presets, results, folder)
    assert (
        "| board2_fedsimclr | 0.0005: —, 0.001: 71.50, 0.002: 70.00, 0.004: — |"
        in (folder / "tuning.md").read_text()
    )

    def cell(*experiments, rounds=50.0):
        method, partition, encoder = line_label(experiments[0], presets)
        values = {"rounds": [rounds] * len(experiments), "linear_top1": [50.0] * len(experiments)}
        return {"evaluation": "ssl", "method": method, "encoder": encoder, "partition": partition}\
            | {"experiments": list(experiments), "values": values, "runs": len(experiments)}\
            | {"last_rounds": set()}  # fmt: skip

    lines = [
        cell("board2_fedsimclr_dir01_s0", "board2_fedsimclr_dir01_s1"),
        cell("board2_fedavg_dir01_s0", "board2_fedavg_dir01_s1"),
        cell("board2_fedbyol_dir01_s0"),  # no run of its sweep scored
        cell("board2_m100_fedavg_dir01_s0"),  # the sweep of FedAvg's small CNN on 10 clients
        cell("board2_random_init_dir01_s0", rounds=0.0),
    ]
    assert tuning.mark_tuning(lines, folder, presets)
    assert [c["tuning"] for c in lines] == [
        "0.002, untuned (its sweep chose 0.001)",
        "0.01, tuned",
        "0.002, untuned (no run of its sweep scored)",
        "0.01, tuned",
        "—",
    ]
    text = table("ssl", lines, "here")
    assert "| runs | lr, tuning |" in text and "| 2 | 0.01, tuned |" in text
    assert "untuned otherwise" in text  # the caption says what tuned means
    assert not tuning.mark_tuning(lines, tmp_path / "no_tuning", presets)  # a board with none


# ------------------------------------------------------------------ what is left, by session
def test_runs_are_cut_into_batches_that_fit_a_session_keeping_their_order():
    runs = [("a", 60.0), ("b", 90.0), ("c", 200.0), ("d", 10.0), ("e", 5.0)]
    assert [[n for n, _ in b] for b in plan.batches(runs, 2.5)] == [["a", "b"], ["c"], ["d", "e"]]
    assert plan.batches([], 2.5) == []


def test_a_run_has_landed_once_every_metrics_file_of_its_own_stages_is_there(
    presets, tmp_path, monkeypatch
):
    from fedssl.plan.dag import Dag

    dag = Dag("board2_tune_edge", presets=presets)
    name = "board2_fedsimclr_lrq_dir01_s0"
    own = [dag.stages[s] for s in dag.of_experiment[name] if s.endswith(f"__{name}")]
    metrics = [m for s in own for m in s.metrics]
    assert len(metrics) >= 1  # the linear probe's at least
    monkeypatch.chdir(tmp_path)
    for m in metrics:
        assert not plan.landed(name, dag)
        (tmp_path / m).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / m).write_text("{}")
    assert plan.landed(name, dag)
    assert not plan.landed("board2_fedu_lr4_dir01_s0", dag)  # another run's stay missing


def test_spent_sums_the_kept_records_and_estimates_only_the_runs_without_one(
    presets, tmp_path, monkeypatch
):
    """A run made with a kept record counts its stages' seconds; one made without (here the
    tuning part's) counts at the estimate, apart; a run not made counts nowhere; a run two
    parts list counts in the first (fedbyol dir01_s0: the tuning part, though p1 reports it);
    a run the part's report lists as stopped was made too."""
    made = {"board2_fedbyol_dir01_s0", "board2_fedbyol_dir01_s1", "board2_fedbyol_dir01_s2"}
    stopped = "board2_fedbyol_dir01_s3"
    monkeypatch.setattr(plan, "landed", lambda name, dag: name in made)
    monkeypatch.setattr(plan, "estimator", lambda board, presets: lambda name: 30.0)
    monkeypatch.setattr("fedssl.reporting.report.REPORTS", tmp_path)
    _report_failing(tmp_path, "board2_p1", stopped)
    record = {
        "pretrain__board2_fedbyol_dir01_s1": 5400.0,
        "features__board2_fedbyol_dir01_s1": 1800.0,
        "pretrain__board2_fedbyol_dir01_s2": 3600.0,
        "pretrain__board2_fedbyol_dir01_s4": 3600.0,  # a record of a run not made: not counted
    }
    (tmp_path / BOARD).mkdir()
    (tmp_path / BOARD / "stage_runs.json").write_text(
        json.dumps({k: {"stage": k, "wall_seconds": v} for k, v in record.items()})
    )
    table = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in plan.spent(BOARD, presets, tmp_path).splitlines()
        if line.startswith(("| board2", "| in all"))
    ]
    rows = {cells[0]: cells[1:] for cells in table}
    assert rows["board2_tune_cnn"] == ["1", "0", "0.0", "0.5"]
    assert rows["board2_p1"] == ["3", "2", "3.0", "0.5"]  # the stopped run: no record
    assert rows["board2_p3"] == ["0", "0", "0.0", "0.0"]
    assert rows["in all"] == ["4", "2", "3.0", "1.0"]
