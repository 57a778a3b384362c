"""The benchmark board: its numbers from hand-made rows, the budget rule, the `benchmark`
pipeline's shared partitions, and a tiny board run through Snakemake."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from fedssl import board
from tests.fixtures import make_tiny_project, run

pytestmark = pytest.mark.timeout(900)


def _row(experiment, method, partition, **values):
    return {"experiment": experiment, "row": method, "arch": "cnn", "column": partition, **values}


ROWS = [
    _row("a0", "A", "IID", linear_top1=70.0, knn_top1=60.0, client_MB_up=2.0, beta_GFLOPs=4.0),
    _row("a1", "A", "IID", linear_top1=72.0, knn_top1=62.0, client_MB_up=2.0, beta_GFLOPs=6.0),
    _row("b0", "B", "IID", personal_top1=80.0, client_MB_up=1.0, rounds=10),
    _row("b1", "B", "IID", personal_top1=90.0, client_MB_up=1.0, rounds=10),
    _row("b2", "B", "IID", personal_top1=85.0, client_MB_up=1.0, rounds=10),
    _row("c0", "C", "IID"),  # no accuracy of the board's: left out
]
WALL = {"a0": 10.0, "a1": 20.0, "b0": 3.0, "b1": 3.0, "b2": 6.0}


def test_board_groups_seeds_and_reports_mean_and_sample_sd():
    cells = board.cells(ROWS, WALL)
    assert [(c["evaluation"], c["method"], c["runs"]) for c in cells] == [
        ("ssl", "A", 2),
        ("personal", "B", 3),
    ]
    numbers = board.metrics(cells)
    a, b = numbers["A | cnn | IID"], numbers["B | cnn | IID"]
    assert a["linear_top1_mean"] == 71.0 and a["linear_top1_sd"] == pytest.approx(1.4142, abs=1e-4)
    assert a["beta_GFLOPs_mean"] == 5.0 and a["wall_s_mean"] == 15.0
    assert b["personal_top1_mean"] == 85.0 and b["personal_top1_sd"] == 5.0  # sample SD (n-1)
    assert b["rounds_mean"] == 10 and b["wall_s_mean"] == 4.0 and "linear_top1_mean" not in b
    text = board.table("ssl", cells, "h (2-core CPU)")
    assert "| A | cnn | IID | 2 | 71.0±1.4 | 61.0±1.4 | 2 | 5 | 15 |" in text
    assert "mean ± sample SD over seeds" in text and "hardware: h (2-core CPU)" in text
    assert "| B | cnn | IID | 3 | 85.0±5.0 | 1 | 10 | 4 |" in board.table("personal", cells, "")


def test_board_files_and_docs_block(tmp_path):
    records = [{"wall_seconds": 7200.0, "environment": {"host": "h", "cpu_count": 2}}]
    written = board.write_board(tmp_path, "bench", ROWS, WALL, records, 7200.0)
    assert json.loads((tmp_path / "board.json").read_text()) == written
    assert written["total_wall_hours"] == 2.0
    for name in ("board.md", "board_tables.md", "board_accuracy_vs_MB.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "h (2-core CPU, torch ?)" in (tmp_path / "board_tables.md").read_text()
    page = "x\n<!-- board: bench -->\nold\n<!-- /board -->\ny\n"
    (tmp_path / "r" / "bench").mkdir(parents=True)
    (tmp_path / "r" / "bench" / "board_tables.md").write_text("T\n")
    assert board.fill_blocks(page, tmp_path / "r") == page.replace("old\n", "T\n")
    assert board.fill_blocks(page, tmp_path / "none") == page  # not run yet: kept
    assert "Partial board" not in (tmp_path / "board_tables.md").read_text()
    # a board made part by part over sessions says how many runs are still to come
    board.write_board(tmp_path / "p", "bench", ROWS, WALL, records, 7200.0, ["a_s1", "b_s0"])
    tables = (tmp_path / "p" / "board_tables.md").read_text()
    assert tables.startswith("*Partial board: 2 runs not made yet (named in report.md).*")
    # a run that stopped with an error is named with its error, not counted in its line
    stopped = [{"experiment": "a_s2", "stage": "train__a_s2", "error": "the loss is nan"}]
    board.write_board(tmp_path / "f", "bench", ROWS, WALL, records, 7200.0, failed=stopped)
    tables = (tmp_path / "f" / "board_tables.md").read_text()
    assert "*1 run(s) stopped with an error" in tables
    assert "`a_s2` (train__a_s2: the loss is nan)" in tables


def test_wall_times_of_an_earlier_sessions_runs_are_kept(tmp_path, monkeypatch):
    """A board made part by part: the records committed beside the board by the first
    rendering fill in the runs this workspace did not make; its own records win."""
    from types import SimpleNamespace

    from fedssl import stage

    def stage_of(exp):
        return SimpleNamespace(out=f"artifacts/experiments/{exp}/pretrain")

    dag = SimpleNamespace(
        stages={
            "data": SimpleNamespace(out="artifacts/data"),
            "pre__a": stage_of("a"),
            "pre__b": stage_of("b"),
        },
        of_experiment={"a": ["data", "pre__a"], "b": ["data", "pre__b"]},
        experiments=["a", "b"],
    )
    env = {"host": "h", "cpu_count": 2}
    here = {"data": 5.0, "pre__a": 100.0}  # this workspace ran a (and the shared data)
    monkeypatch.setattr(
        stage,
        "run_record",
        lambda n: {"stage": n, "wall_seconds": here[n], "environment": env} if n in here else {},
    )
    wall, records, total = board.run_records(dag, board.kept_records(tmp_path))
    assert wall == {"a": 105.0} and total == 105.0  # nothing kept yet: b has no wall time
    board.write_board(tmp_path, "bench", ROWS, WALL, records, total)
    kept = board.kept_records(tmp_path)  # what the caption needs of each machine survives
    assert board.hardware(kept.values()) == board.hardware(records) == "h (2-core CPU, torch ?)"
    here.clear()
    here.update({"data": 6.0, "pre__b": 40.0})  # the next session runs b
    wall, records, total = board.run_records(dag, board.kept_records(tmp_path))
    assert wall == {"a": 106.0, "b": 46.0} and total == 146.0


def test_dvc_metrics_diff_between_two_boards(tmp_path):
    """Two renderings of a board, committed one after the other: ``dvc metrics diff`` names
    the line whose accuracy moved, with both values."""
    records = [{"wall_seconds": 60.0, "environment": {"host": "h", "cpu_count": 2}}]
    folder = tmp_path / "results" / "reports" / "bench"
    (tmp_path / "dvc.yaml").write_text("metrics:\n- results/reports/bench/board.json\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    run(["git", "init", "-q"], tmp_path)
    run(["dvc", "init", "-q"], tmp_path)
    for first in (70.0, 74.0):  # the second board's A ran better in its first seed
        rows = [{**ROWS[0], "linear_top1": first}, *ROWS[1:]]
        board.write_board(folder, "bench", rows, WALL, records, 60.0)
        run(["git", "add", "-A"], tmp_path)
        run([*git, "commit", "-qm", f"board {first}"], tmp_path)
    diff = json.loads(run(["dvc", "metrics", "diff", "HEAD~1", "--json"], tmp_path).stdout)
    moved = diff["results/reports/bench/board.json"]
    assert moved["lines.A | cnn | IID.linear_top1_mean"] == {"old": 71.0, "new": 73.0, "diff": 2.0}
    assert "lines.B | cnn | IID.personal_top1_mean" not in moved  # unchanged lines stay out


def test_budget_rule_arithmetic():
    assert board.per_run_budget(10800, 60, 240) == pytest.approx(44.75)
    assert board.rounds_within(44.75, 20.0, 6.0) == 4  # floor(24.75 / 6)
    assert board.rounds_within(44.75, 50.0, 6.0) == 1  # at least one round
    assert board.rounds_within(44.75, 50.0, 6.0, least=3) == 3  # or the method's least
    with pytest.raises(ValueError, match="round_s"):
        board.rounds_within(10, 1, 0)
    with pytest.raises(ValueError, match="runs"):
        board.per_run_budget(10, 1, 0)


def test_budget_table_sets_the_presets_rounds():
    """The committed per-round times, through the rule, give the rounds the presets run."""
    from fedssl.presets import Presets, lookup

    lines = board.budget_table()
    presets = Presets()
    trained = [  # the random-init reference trains nothing: it is outside the rule
        e
        for e in presets.pipeline_experiments("benchmark")
        if presets.load("experiment", e).method.name != "none"
    ]
    assert sum(int(x["runs"]) for x in lines) == len(trained) == 246
    for line in lines:
        params = presets.load("experiment", line["preset"]).model_dump(mode="json")
        assert lookup(params, line["rounds_key"]) == line["rounds"], line["preset"]


def test_benchmark_plans_shared_partitions_and_seeds():
    from fedssl.plan.dag import Dag

    dag = Dag("benchmark")
    kinds = [s.kind for s in dag.stages.values()]
    assert kinds.count("prepare_data") == 1 and kinds.count("partition") == 3
    parts = {s.name for s in dag.stages.values() if s.kind == "partition"}
    assert parts == {f"partition__bench_fmnist_{p}_m10" for p in ("iid", "dir01", "shards2")}
    for name in dag.experiments:  # every run reads one of the three shared partitions
        stages = [dag.stages[s] for s in dag.of_experiment[name]]
        assert {u for s in stages for u in s.upstream if u.startswith("partition__")} <= parts
    # seeds 0-2 of every method on every partition it runs on
    seeds = {}
    for name in dag.experiments:
        exp = dag.presets.load("experiment", name)
        seeds.setdefault((exp.method.name, exp.title, exp.partition), set()).add(exp.method.seed)
    assert set(map(frozenset, seeds.values())) == {frozenset({0, 1, 2})}
    # probed methods on all three partitions, personalised ones on the two label-skew ones
    from fedssl.methods import registry

    partitions = {}
    for method, title, partition in seeds:
        partitions.setdefault((method, title), set()).add(partition)
    assert len(partitions) == 19 + 14  # rows of the two tables (random init included)
    skew = {"bench_fmnist_dir01_m10", "bench_fmnist_shards2_m10"}
    for (method, title), mine in partitions.items():
        personal = "personal" in registry.get(method).evaluation_sections
        assert mine == (skew if personal else skew | {"bench_fmnist_iid_m10"}), title
    # CP-CFL's server pretraining reads the server slice, not the clients: one per seed
    cpcfl = {
        s for e in dag.experiments if e.startswith("bench_cpcfl_") for s in dag.of_experiment[e]
    }
    assert len([s for s in cpcfl if s.startswith("pretrain__")]) == 3


TINY_SEED = "extends: {base}\nmethod: {{seed: {seed}}}\n"


@pytest.fixture(scope="module")
def tiny_board(tmp_path_factory):
    """A tiny project with a two-method board (FedSimCLR and random init, two seeds each),
    run through Snakemake, and its board rendered."""
    root = make_tiny_project(tmp_path_factory.mktemp("board"))
    exps = root / "params" / "experiments"
    for base in ("tiny_simclr", "tiny_random"):
        (exps / f"{base}_s1.yaml").write_text(TINY_SEED.format(base=base, seed=1))
    with open(root / "params" / "pipelines.yaml", "a") as f:
        f.write("  board: [tiny_simclr, tiny_simclr_s1, tiny_random, tiny_random_s1]\n")
    run(["snakemake", "--cores", "2", "--config", "pipeline=board"], root)
    run(["python", "-m", "fedssl.board", "render", "board"], root)
    return root


@pytest.mark.timeout(1800)  # a minute or two on idle cores; 16 stage processes
def test_tiny_board_numbers_come_from_the_runs(tiny_board):
    folder = tiny_board / "results" / "reports" / "board"
    rows = json.loads((folder / "report.json").read_text())["rows"]
    lines = json.loads((folder / "board.json").read_text())["lines"]
    assert len(lines) == 2
    for method in ("FedSimCLR", "Random init"):
        mine = [r for r in rows if r["row"] == method]
        line = next(v for k, v in lines.items() if k.startswith(method))
        assert line["runs"] == 2
        accuracy = [r["linear_top1"] for r in mine]
        assert line["linear_top1_mean"] == pytest.approx(statistics.mean(accuracy), abs=1e-4)
        assert line["linear_top1_sd"] == pytest.approx(statistics.stdev(accuracy), abs=1e-4)
    # wall time: the run records of the FedSimCLR runs' own stages
    runs = tiny_board / "artifacts" / ".runs"
    walls = [
        sum(json.loads((runs / f"{k}__{e}.json").read_text())["wall_seconds"] for k in kinds)
        for e in ("tiny_simclr", "tiny_simclr_s1")
        for kinds in [("pretrain", "features", "evaluate", "costs")]
    ]
    assert min(walls) > 0
    simclr = next(v for k, v in lines.items() if k.startswith("FedSimCLR"))
    assert simclr["wall_s_mean"] == pytest.approx(statistics.mean(walls), abs=1e-3)
    assert simclr["client_MB_up_mean"] > 0 and "wall s" in (folder / "board.md").read_text()
    assert Path(folder / "board_accuracy_vs_GFLOPs.png").stat().st_size > 0


def test_benchmark_gpu_is_planned_by_the_dvc_writer():
    """The GPU board has a dvc.yaml from the same DAG (written when asked for, not run)."""
    import yaml

    from fedssl.plan.dvcfile import generated_files

    files = generated_files(also=("benchmark_gpu",))
    stages = yaml.safe_load(files[Path("pipelines/benchmark_gpu/dvc.yaml")])["stages"]
    assert stages["report__benchmark_gpu"]["cmd"] == "python -m stages.report benchmark_gpu"
    parts = [s for s in stages if s.startswith("partition__")]
    assert sorted(parts) == [
        f"partition__gpubench_fmnist_{p}_m10" for p in ("dir01", "iid", "shards2")
    ]
    assert {"cache": False, "persist": True} in [
        v for out in stages["report__benchmark_gpu"]["outs"] for v in out.values()
    ]
