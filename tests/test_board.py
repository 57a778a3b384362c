"""The benchmark board: its numbers from hand-made rows, the budget rule, the `benchmark`
pipeline's shared partitions, and a tiny board run through Snakemake."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from fedssl.reporting import board
from fedssl.stage.record import ParamsError
from tests.fixtures import made_tiny_project, run

pytestmark = pytest.mark.timeout(900)


def _row(experiment, method, partition, **values):
    return {"experiment": experiment, "row": method, "arch": "cnn", "column": partition, **values}


def _ssl_runs(method, seeds=2, **values):
    """A self-supervised line's runs ``<method>_s<i>`` on partition X, alike in ``values``."""
    return [
        {**_row(f"{method.lower()}_s{i}", method, "X", **values), "evaluation": "ssl"}
        for i in range(seeds)
    ]


ROWS = [
    _row("a0", "A", "IID", linear_top1=70.0, knn_top1=60.0, client_MB_up=2.0, client_GFLOPs=4.0),
    _row("a1", "A", "IID", linear_top1=72.0, knn_top1=62.0, client_MB_up=2.0, client_GFLOPs=6.0),
    _row("b0", "B", "IID", personal_top1=80.0, client_MB_up=1.0, rounds=10),
    _row("b1", "B", "IID", personal_top1=90.0, client_MB_up=1.0, rounds=10),
    _row("b2", "B", "IID", personal_top1=85.0, client_MB_up=1.0, rounds=10),
    _row("c0", "C", "IID"),  # no accuracy of the board's: left out
]
WALL = {"a0": 10.0, "a1": 20.0, "b0": 3.0, "b1": 3.0, "b2": 6.0}


def test_board_groups_seeds_and_reports_mean_and_sample_sd():
    cells = board.cells.cells(ROWS, WALL)
    assert [(c["evaluation"], c["method"], c["runs"]) for c in cells] == [
        ("ssl", "A", 2),
        ("personal", "B", 3),
    ]
    board.significance.compare_lines(cells)
    numbers = board.significance.metrics(cells)
    a, b = numbers["A | cnn | IID"], numbers["B | cnn | IID"]
    assert a["linear_top1_mean"] == 71.0 and a["linear_top1_sd"] == pytest.approx(1.4142, abs=1e-4)
    assert a["client_GFLOPs_mean"] == 5.0 and a["wall_s_mean"] == 15.0
    assert a["client_MB_exchanged_mean"] == 2.0  # up only: the rows have no costs stage's total
    # 71 ± t(0.975, 1) 1.414 / sqrt 2 = 71 ± 12.706
    assert a["linear_top1_ci95"] == pytest.approx([58.2938, 83.7062], abs=1e-3)
    assert b["personal_top1_mean"] == 85.0 and b["personal_top1_sd"] == 5.0  # sample SD (n-1)
    assert b["rounds_mean"] == 10 and b["wall_s_mean"] == 4.0 and "linear_top1_mean" not in b
    text = board.tables.table("ssl", cells, "h (2-core CPU)")
    assert (
        "| A | cnn | IID | 2 | 71.0±1.4 | [58.3, 83.7] | best |  | 61.0±1.4 | 2 | 5 | 5 |" in text
    )
    assert "mean ± sample SD over seeds" in text and "hardware: h (2-core CPU)" in text
    assert (
        "| B | cnn | IID | 3 | 85.0±5.0 | [72.6, 97.4] | best |  | 1 | 10 |"
        in board.tables.table("personal", cells, "")
    )


def test_costs_are_every_byte_from_the_ledger():
    """A one-shot transfer outside the rounds (MFCL's representation upload) is in the
    costs stage's ledger total, and the board's MB column is that total, not up + down."""
    mfcl = _row("m0", "M", "IID", linear_top1=70.0, client_MB_up=0.02, client_MB_down=0.02)
    mfcl["client_MB_exchanged"] = "15.1"  # as the report writes it (text)
    assert board.cells.client_mb(mfcl) == 15.1
    assert board.cells.client_mb(_row("x", "X", "IID", client_MB_up=1.0, client_MB_down=0.5)) == 1.5
    assert board.cells.client_mb(_row("y", "Y", "IID")) is None


def test_committed_board_costs_equal_the_reports_ledger_totals():
    """Every line of the committed board, of every method on it: its MB / client is the mean
    of its runs' ledger totals in the report's rows (MFCL 15.1 MB, not 0.04)."""
    from fedssl.reporting.formatting import to_float

    folder = Path("results/reports/benchmark")
    rows = json.loads((folder / "report.json").read_text())["rows"]
    lines = json.loads((folder / "board.json").read_text())["lines"]
    by_line: dict[str, list[dict]] = {}
    for r in rows:
        key = " | ".join(x for x in (r["row"], r.get("arch", ""), r["column"]) if x)
        by_line.setdefault(key, []).append(r)
    assert set(lines) <= set(by_line) and len(lines) == 19 * 3 + 14 * 2
    methods = set()
    for key, line in lines.items():
        totals = []
        for r in by_line[key]:
            total = to_float(r.get("client_MB_exchanged"))
            if total is None:  # no costs stage (random init): the rounds' traffic
                total = r["client_MB_up"] + r["client_MB_down"]
            totals.append(total)
        assert line["client_MB_exchanged_mean"] == pytest.approx(
            statistics.mean(totals), abs=1e-4
        ), key
        methods.add(tuple(key.split(" | ")[:2]))
    assert len(methods) == 33
    mfcl = lines["MFCL(TN) | resnet18-tn | F-MNIST IID"]
    assert mfcl["client_MB_exchanged_mean"] == pytest.approx(15.1)


def test_confidence_on_constructed_data():
    from fedssl.reporting import stats

    lo, hi = stats.interval([1.0, 2.0, 3.0])  # 2 ± t(0.975, 2) / sqrt 3 = 2 ± 2.4841
    assert (lo, hi) == (pytest.approx(-0.4841, abs=1e-4), pytest.approx(4.4841, abs=1e-4))
    assert stats.interval([5.0]) is None
    # paired: differences 1, 2, 3 -> t = 2 / (1 / sqrt 3); with 2 df, p = 1 - t / sqrt(t^2 + 2)
    a = {"0": 11.0, "1": 12.0, "2": 13.0}
    b = {"0": 10.0, "1": 10.0, "2": 10.0}
    c = stats.compare(a, b)
    t = 2 * 3**0.5
    assert c.test == "paired t" and c.n == 3 and c.difference == pytest.approx(2.0)
    assert c.p == pytest.approx(1 - t / (t * t + 2) ** 0.5, abs=1e-9)
    # the same numbers unpaired would not separate as well: pairing removes the seed's share
    shifted = {"0": 20.0, "1": 30.0, "2": 40.0}
    assert stats.compare({s: v + 1 for s, v in shifted.items()}, shifted).p == 0.0
    welch = stats.compare({s: v + 1 for s, v in shifted.items()}, {"7": 20.0, "8": 40.0})
    assert welch.test == "Welch t" and welch.p > 0.5
    assert stats.compare({"0": 1.0}, {"0": 2.0}).test == "untested"
    assert stats.holm([0.01, 0.04, 0.03, None]) == [
        pytest.approx(0.03),
        pytest.approx(0.06),
        pytest.approx(0.06),
        None,
    ]


def _line(method, values, mb=1.0, encoder="cnn"):
    return [
        {
            "experiment": f"{method}_s{i}",
            "row": method,
            "arch": encoder,
            "column": "P",
            "linear_top1": v,
            "client_MB_up": mb,
        }
        for i, v in enumerate(values)
    ]


def test_which_lines_separate_from_the_best_and_from_their_reference():
    """Constructed lines over three seeds: B sits a steady 5 points under A (separable), C
    is as good as A on average but noisy (not separable), R exchanges nothing (the untrained
    twin of the encoder); the board says so, in its table and in words."""
    rows = (
        _line("A", [80.0, 82.0, 81.0])
        + _line("B", [75.0, 77.1, 75.9])
        + _line("C", [70.0, 90.0, 79.0])
        + _line("R", [70.0, 72.0, 71.5], mb=0.0)
    )
    cells = board.cells.cells(rows, {})
    board.significance.compare_lines(cells)
    got = {c["method"]: c for c in cells}
    assert got["A"]["vs_best"] == {"verdict": "best"}
    assert got["B"]["vs_best"]["verdict"] == "separable"
    assert got["B"]["vs_best"]["difference"] == pytest.approx(-5.0, abs=1e-3)
    assert got["C"]["vs_best"]["verdict"] == "not separable"
    assert board.cells.is_reference(got["R"]) and "vs_reference" not in got["R"]
    assert got["A"]["vs_reference"]["verdict"] == "separable"
    assert got["A"]["vs_reference"]["difference"] == pytest.approx(9.8333, abs=1e-3)
    assert got["C"]["vs_reference"]["verdict"] == "not separable"
    # the screening leaves the reference out: B and C against A, Benjamini-Hochberg over two
    # (B's rank 1 of 2: twice its p; C's rank 2: its own), R has no screening cell
    assert "vs_best" not in got["R"]
    assert got["B"]["vs_best"]["adjusted"] == "BH"
    assert got["B"]["vs_best"]["p_adj"] == pytest.approx(2 * got["B"]["vs_best"]["p"], abs=1e-4)
    assert got["C"]["vs_best"]["p_adj"] == got["C"]["vs_best"]["p"]
    assert got["A"]["vs_reference"]["adjusted"] == "Holm"
    text = board.tables.tables_text(cells, "h", 60.0)
    # the difference's paired interval beside the adjusted p: B - A = -5.0, -4.9, -5.1
    assert got["B"]["vs_best"]["ci95"] == pytest.approx([-5.2484, -4.7516], abs=1e-3)
    assert (
        "| B | cnn | P | 3 | 76.0±1.1 | [73.4, 78.6] | −5.0 [−5.2, −4.8] (p < 0.001) "
        "| +4.8 [+3.9, +5.8] (p 0.0041) |" in text
    )
    assert (
        "| C | cnn | P | 3 | 79.7±10.0 | [54.8, 104.5] | −1.3 [−23.7, +21.1] not separable "
        "(p 0.82) |" in text
    )
    assert "best **A** (81.0); not separable from it: C; below it: B." in text
    assert "reference of their encoder: above A, B; not separable C; below none." in text


def test_the_best_line_is_one_that_can_be_tested_against():
    """A line with one run (its first seed, on a board made part by part) is not the best even
    where its mean is highest: the best is the highest of the lines with two runs or more, and
    the single run is untested against it; with no such line, the highest of all."""
    rows = _line("A", [90.0]) + _line("B", [80.0, 82.0, 81.0]) + _line("C", [70.0, 72.0, 71.0])
    cells = board.cells.cells(rows, {})
    board.significance.compare_lines(cells)
    got = {c["method"]: c for c in cells}
    assert got["B"]["vs_best"] == {"verdict": "best"}
    assert got["A"]["vs_best"]["verdict"] == "untested"
    assert got["C"]["vs_best"]["verdict"] == "separable"
    cells = board.cells.cells(_line("A", [90.0]) + _line("B", [80.0]), {})
    board.significance.compare_lines(cells)
    assert next(c for c in cells if c["method"] == "A")["vs_best"] == {"verdict": "best"}


def test_a_line_that_trained_no_round_is_its_encoders_reference_even_when_it_sends_bytes():
    """MFCL's untrained stem still uploads its representations once (MB > 0), yet trained no
    round: it is the reference its trained line is read against, and a trained line is not."""
    trained = [r | {"rounds": 50} for r in _line("M", [60.0, 61.0, 62.0], mb=15.0)]
    stem = [r | {"rounds": 0} for r in _line("M stem at init", [65.0, 66.5, 67.0], mb=15.0)]
    cells = board.cells.cells(trained + stem, {})
    board.significance.compare_lines(cells)
    got = {c["method"]: c for c in cells}
    assert board.cells.is_reference(got["M stem at init"]) and not board.cells.is_reference(
        got["M"]
    )
    assert got["M"]["vs_reference"]["against"] == "M stem at init"
    assert got["M"]["vs_reference"]["difference"] == pytest.approx(-5.1667, abs=1e-3)


def test_a_line_with_no_traffic_recorded_is_compared_not_taken_for_a_reference():
    """Rows with an accuracy and neither bytes nor rounds (a report without a costs stage):
    the comparisons run (they stopped on a KeyError) and no line is a reference."""
    cells = board.cells.cells(
        [
            _row(f"{m}_s{i}", m, "P", linear_top1=v + i)
            for m, v in (("A", 70.0), ("B", 60.0))
            for i in range(2)
        ],
        {},
    )
    board.significance.compare_lines(cells)
    assert not any(board.cells.is_reference(c) for c in cells)
    assert [c["vs_best"]["verdict"] for c in cells] == ["best", "separable"]


def test_personalised_accuracy_is_the_last_rounds_mean():
    rows = [
        {**_row(f"p_s{i}", "P", "X", personal_top1=90.0 + i), "personal_last10": 80.0 + i}
        for i in range(3)
    ]
    (cell,) = board.cells.cells(rows, {})
    assert board.cells.accuracy_of(cell) == "personal_last" and cell["last_rounds"] == {10}
    assert "averaged over the last 10 rounds" in board.tables.table("personal", [cell], "")
    assert "| P | cnn | X | 3 | 81.0±1.0 |" in board.tables.table("personal", [cell], "")


def test_rounds_to_the_target_from_the_round_logs(tmp_path):
    """A personalised line reaches its reference's (SOLO's) accuracy at the median of its
    runs' first rounds there; MB by the ledger total shared out as the round log's bytes."""
    solo = [
        {
            **_row(f"solo_s{i}", "SOLO", "X", personal_top1=70.0, client_MB_up=0.0),
            "personal_last2": 70.0,
        }
        for i in range(3)
    ]
    mine = [
        {**_row(f"m_s{i}", "M", "X", personal_top1=90.0, client_MB_up=2.0, client_MB_down=2.0,
                client_GFLOPs=40.0), "personal_last2": 90.0}
        for i in range(3)
    ]  # fmt: skip
    logs = {
        f"m_s{i}": [
            {"round": r + 1, "personal_acc": acc, "bytes_up": 10, "bytes_down": 10}
            for r, acc in enumerate(curve)
        ]
        for i, curve in enumerate([[50, 71, 80, 90], [50, 60, 72, 90], [50, 60, 65, 69]])
    }
    cells = board.cells.cells(solo + mine, {})
    board.cells.rounds_to_target(cells, logs)
    target = next(c for c in cells if c["method"] == "M")["to_target"]
    # runs reach 70 at rounds 2, 3 and never: the median is 3; 3 of 4 rounds' bytes of 4 MB
    assert target == {"target": 70.0, "reached": 2, "of": 3, "rounds": 3, "MB": 3.0, "GFLOPs": 30.0}
    # the personalised family has a figure of its own, beside the encoders' one
    ssl = _ssl_runs("E", knn_top1=60.0, client_MB_up=1.0, client_GFLOPs=20.0)
    logs |= {f"e_s{i}": [{"round": 1, "knn_monitor": 40.0, "bytes_up": 5}] for i in range(2)}
    files = board.figures.plot_over_run(cells + board.cells.cells(ssl, {}), logs, tmp_path)
    assert files == ["board_over_run_personalised.png", "board_over_run_encoders.png"]


def test_accuracy_over_the_run_also_reads_against_wall_time(tmp_path):
    """Each monitored round gives (round, accuracy, MB, GFLOPs, wall minutes so far), the wall
    time summed from the round log's seconds, or where the log has none shared out from the
    run's; the figure has a panel per axis, wall time on a linear scale beside the log-scaled
    costs."""
    rows = _ssl_runs("M", knn_top1=60.0, client_MB_up=1.0, client_MB_down=1.0, client_GFLOPs=20.0)
    logs = {
        f"m_s{i}": [
            {"round": 1, "knn_monitor": 40.0 + i, "seconds": 30, "bytes_up": 5, "bytes_down": 5},
            {"round": 2, "knn_monitor": "", "seconds": 60, "bytes_up": 5, "bytes_down": 5},
            {"round": 3, "knn_monitor": 50.0 + i, "seconds": 90, "bytes_up": 5, "bytes_down": 5},
        ]
        for i in range(2)
    }
    (cell,) = board.cells.cells(rows, {})
    curves = board.cells.run_curves(cell, logs)
    assert [p[4] for p in curves[0]] == [0.5, 3.0]  # 30 s, then 30 + 60 + 90 s, in minutes
    assert [p[0] for p in curves[1]] == [1, 3] and [p[1] for p in curves[1]] == [41.0, 51.0]
    assert curves[0][1][2:4] == (2.0, 20.0)  # every byte and FLOP by the last round
    assert board.figures.plot_over_run([cell], logs, tmp_path) == ["board_over_run_encoders.png"]
    assert (tmp_path / "board_over_run_encoders.png").stat().st_size > 0
    assert [axis for axis, _ in board.figures.OVER_RUN_AXES.values()][:2] == [
        "round", "wall minutes"
    ]  # fmt: skip
    assert "wall minutes" not in board.figures.COST_AXES
    # a committed log keeps no timings: the run's wall time (its stages) shared over its rounds
    for rows_of in logs.values():
        for r in rows_of:
            del r["seconds"]
    (cell,) = board.cells.cells(rows, {"m_s0": 600.0, "m_s1": 900.0})
    assert [p[4] for p in board.cells.run_curves(cell, logs)[0]] == [600 / 60 / 3, 600 / 60]


def test_an_untrained_reference_is_never_on_the_pareto_front():
    """MFCL's untrained stem costs bytes (its representations) and may be the cheapest point:
    it is drawn hollow and numbered, and the front is made of the methods alone."""
    from fedssl.reporting import figures

    plt = figures._pyplot()
    fig, ax = plt.subplots()
    points = [
        {"x": 1.0, "y": 80.0, "label": "stem at init", "group": "g", "reference": True},
        {"x": 10.0, "y": 70.0, "label": "A", "group": "g"},
        {"x": 20.0, "y": 75.0, "label": "B", "group": "g"},
        {"x": 30.0, "y": 74.0, "label": "C", "group": "g"},
    ]
    numbered = {}
    assert figures._cost_panel(ax, points, {"g": "k"}, numbered) == ["1", "A", "B", "2"]
    assert numbered == {"stem at init": 1, "C": 2}
    plt.close(fig)


def test_the_key_wraps_between_names_never_inside_one():
    """Each line of the key under a figure holds whole names: '21:' never ends a line whose
    name, or a hyphenated name's second half, starts the next."""
    from fedssl.reporting import figures

    names = ["FedAvg", "LG-FedAvg", "APFL (α=learned)", "FedProx (μ=0.01)", "Ditto (λ=1)"]
    numbered = {
        f"{name} {k}": i
        for i, (k, name) in enumerate([(k, name) for k in range(3) for name in names], 1)
    }
    lines = figures.numbered_key(numbered, 24)
    assert len(lines) > 3 and all(len(line) <= 24 for line in lines)
    entries = [e for line in lines for e in line.removeprefix("Off the front:").split("   ")]
    assert lines[0].startswith("Off the front:")
    assert [e.strip().replace("\u00a0", " ") for e in entries if e.strip()] == [
        f"{i}: {name}" for name, i in numbered.items()
    ]


def test_figure_helpers():
    from fedssl.reporting import figures

    plt = figures._pyplot()
    names = [f"line {i}" for i in range(14)]  # more than ten: still ten distinct hues first
    colours = figures.colours_for(plt, names)
    assert [colours[n] for n in names[:10]] == [plt.get_cmap("tab10")(i) for i in range(10)]
    assert len(set(colours.values())) == 14

    points = [(1.0, 60.0), (2.0, 70.0), (2.0, 65.0), (4.0, 68.0), (8.0, 75.0), (0.5, 50.0)]
    assert figures.pareto_front(points) == [5, 0, 1, 4]  # by cost; (4, 68) is beaten by (2, 70)
    median, low, high = figures.band([[1.0, 2.0, 9.0], [3.0, 4.0], [2.0, 3.0, 5.0]])
    assert (median, low, high) == ([2.0, 3.0], [1.0, 2.0], [3.0, 4.0])
    assert figures.diverged([1.0, float("nan")], 2, True)
    assert figures.diverged([1.0, 0.9], 3, False)  # stopped before its line's other runs
    assert figures.diverged([1.0, 0.9, 0.8, 3.7e13], 4, True)
    assert not figures.diverged([0.0, 5.0], 2, True)  # a first loss of 0 is not a divergence
    assert figures.robust_limits([1.0, 3.0, float("inf")]) == (0.9, 3.1)
    title = "F-MNIST 2 classes/client · personalised · cnn16-32-fc64/P64-32/O\nagainst MB"
    assert figures.wrap_title(title, 50) == (
        "F-MNIST 2 classes/client · personalised ·\ncnn16-32-fc64/P64-32/O\nagainst MB"
    )
    assert figures.wrap_title(title, 70) == title  # fits: one line as it was
    assert figures.wrap_title("a-very-long-part · b", 5) == "a-very-long-part ·\nb"


def test_untrained_levels_are_labelled_off_the_data():
    """An untrained network's level is labelled in the panel's right margin, where no point's
    label can sit on it (the board's points cluster at the twin's accuracy), and two close
    levels' labels do not overlap."""
    from fedssl.reporting import figures

    plt = figures._pyplot()
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([1, 10], [70, 80], "o")
    figures._margin_levels(ax, [("untrained cnn", 72.0), ("untrained vit", 72.05)])
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    panel = ax.get_window_extent(renderer)
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) == 2 and all(b.x0 >= panel.x1 for b in boxes)
    assert not boxes[0].overlaps(boxes[1])
    plt.close(fig)


def test_a_panels_targets_say_what_and_whose_and_do_not_overlap():
    """The accuracy-over-run panels draw a level per distinct target: one shared by every line
    says what it is; several say whose each is (lines' settings dropped, many lines counted),
    and their labels are stacked apart even when the targets are a hair apart."""
    from fedssl.reporting import figures

    ssl = [(m, "encoders", 73.35) for m in ("A", "B", "C", "D")]
    supervised = [("FedAvg", "encoders", 74.4), ("FedProx (μ=0.01)", "encoders", 74.4)]
    assert board.figures._distinct_levels(ssl) == [("target: untrained + 3", 73.35)]
    assert board.figures._distinct_levels(ssl + supervised) == [
        ("target: untrained + 3 (4 lines)", 73.35),
        ("target: untrained + 3 (FedAvg, FedProx)", 74.4),
    ]
    assert board.figures._distinct_levels([("FedRep", "personal", 60.0)]) == [
        ("target: SOLO's accuracy", 60.0)
    ]
    plt = figures._pyplot()
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([1, 10], [60, 80])
    figures._levels(ax, [("upper", 72.1), ("lower", 72.0)])
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    lower, upper = sorted(ax.texts, key=lambda t: t.get_text())
    assert not lower.get_window_extent(renderer).overlaps(upper.get_window_extent(renderer))
    plt.close(fig)


def test_board_files_and_docs_block(tmp_path):
    records = [{"wall_seconds": 7200.0, "environment": {"host": "h", "cpu_count": 2}}]
    written = board.write.write_board(tmp_path, "bench", ROWS, WALL, records, 7200.0)
    assert json.loads((tmp_path / "board.json").read_text()) == written
    assert written["total_wall_hours"] == 2.0
    for name in ("board.md", "board_tables.md", "board_accuracy_vs_MB.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "h (2-core CPU, torch ?)" in (tmp_path / "board_tables.md").read_text()
    page = "x\n<!-- board: bench -->\nold\n<!-- /board -->\ny\n"
    (tmp_path / "r" / "bench").mkdir(parents=True)
    (tmp_path / "r" / "bench" / "board_tables.md").write_text("T\n")
    assert board.write.fill_blocks(page, tmp_path / "r") == page.replace("old\n", "T\n")
    assert board.write.fill_blocks(page, tmp_path / "none") == page  # not run yet: kept
    assert "Partial board" not in (tmp_path / "board_tables.md").read_text()
    # a board made part by part over sessions says how many runs are still to come
    board.write.write_board(tmp_path / "p", "bench", ROWS, WALL, records, 7200.0, ["a_s1", "b_s0"])
    tables = (tmp_path / "p" / "board_tables.md").read_text()
    assert tables.startswith("*Partial board: 2 runs not made yet (named in report.md).*")
    # a run that stopped with an error is named with its error, not counted in its line
    stopped = [{"experiment": "a_s2", "stage": "train__a_s2", "error": "the loss is nan"}]
    board.write.write_board(tmp_path / "f", "bench", ROWS, WALL, records, 7200.0, failed=stopped)
    tables = (tmp_path / "f" / "board_tables.md").read_text()
    assert "*1 run(s) stopped with an error" in tables
    assert "`a_s2` (train__a_s2: the loss is nan)" in tables


def test_a_line_with_failed_runs_shows_its_failure_rate_not_its_survivors_alone():
    """Two of P's three runs diverged: its line averages the one that finished and its runs
    column says '1 (+2 failed)' (board.json: failed_runs 2); a failure labelled with no line
    of the board changes no line; the committed board's failed runs are labelled with the
    line their report row would have had (Per-FedAvg on 2 classes/client)."""
    rows = _line("P", [80.0]) + _line("Q", [70.0, 71.0])
    stopped = [
        {"experiment": f"P_s{i}", "row": "P", "arch": "cnn", "column": "P"} for i in (1, 2)
    ] + [{"experiment": "Z_s0", "row": "Z", "arch": "cnn", "column": "P"}]
    cells = board.cells.cells(rows, {})
    board.cells.count_failures(cells, stopped)
    board.significance.compare_lines(cells)
    text = board.tables.tables_text(cells, "h", 60.0)
    assert "| P | cnn | P | 1 (+2 failed) | 80.0 |" in text
    assert "| Q | cnn | P | 2 | 70.5±0.7 |" in text
    numbers = board.significance.metrics(cells)
    assert (
        numbers["P | cnn | P"]["failed_runs"] == 2 and "failed_runs" not in numbers["Q | cnn | P"]
    )
    from fedssl.plan.dag import Dag

    failed = json.loads(Path("results/reports/board/report.json").read_text())["failed"]
    labelled = board.write.labelled_runs(failed, Dag("board"))
    assert {(f["row"], f["column"]) for f in labelled} == {
        ("Per-FedAvg (FO)", "F-MNIST 2 classes/client")
    }
    line = json.loads(Path("results/reports/board/board.json").read_text())["lines"]
    assert line["Per-FedAvg (FO) | cnn16-32-fc64/P64-32/O | F-MNIST 2 classes/client"] == (
        line["Per-FedAvg (FO) | cnn16-32-fc64/P64-32/O | F-MNIST 2 classes/client"]
        | {"runs": 1, "failed_runs": 2}
    )


def test_wall_times_of_an_earlier_sessions_runs_are_kept(tmp_path, monkeypatch):
    """A board made part by part: the records committed beside the board by the first
    rendering fill in the runs this workspace did not make; its own records win."""
    from types import SimpleNamespace

    from fedssl.stage import context as stage

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
    wall, records, total = board.write.run_records(dag, board.write.kept_records(tmp_path))
    assert wall == {"a": 105.0} and total == 105.0  # nothing kept yet: b has no wall time
    board.write.write_board(tmp_path, "bench", ROWS, WALL, records, total)
    kept = board.write.kept_records(tmp_path)  # what the caption needs of each machine survives
    assert (
        board.tables.hardware(kept.values())
        == board.tables.hardware(records)
        == "h (2-core CPU, torch ?)"
    )
    here.clear()
    here.update({"data": 6.0, "pre__b": 40.0})  # the next session runs b
    wall, records, total = board.write.run_records(dag, board.write.kept_records(tmp_path))
    assert wall == {"a": 106.0, "b": 46.0} and total == 146.0
    # b stopped half-way (no row, no failure): its stage time is not the board's
    wall, records, total = board.write.run_records(dag, board.write.kept_records(tmp_path), {"a"})
    assert wall == {"a": 106.0} and total == 106.0


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
        board.write.write_board(folder, "bench", rows, WALL, records, 60.0)
        run(["git", "add", "-A"], tmp_path)
        run([*git, "commit", "-qm", f"board {first}"], tmp_path)
    diff = json.loads(run(["dvc", "metrics", "diff", "HEAD~1", "--json"], tmp_path).stdout)
    moved = diff["results/reports/bench/board.json"]
    assert moved["lines.A | cnn | IID.linear_top1_mean"] == {"old": 71.0, "new": 73.0, "diff": 2.0}
    assert "lines.B | cnn | IID.personal_top1_mean" not in moved  # unchanged lines stay out


def test_budget_rule_arithmetic():
    assert board.budget.per_run_budget(10800, 60, 240) == pytest.approx(44.75)
    assert board.budget.rounds_within(44.75, 20.0, 6.0) == 4  # floor(24.75 / 6)
    assert board.budget.rounds_within(44.75, 50.0, 6.0) == 1  # at least one round
    assert board.budget.rounds_within(44.75, 50.0, 6.0, least=3) == 3  # or the method's least
    with pytest.raises(ValueError, match="round_s"):
        board.budget.rounds_within(10, 1, 0)
    with pytest.raises(ValueError, match="runs"):
        board.budget.per_run_budget(10, 1, 0)


def test_budget_table_sets_the_presets_rounds():
    """The committed per-round times, through the rule, give the rounds the presets run."""
    from fedssl.presets import Presets, lookup

    lines = board.budget.budget_table()
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


def test_the_budget_lines_are_derived_from_the_presets_and_measured_for_each():
    """The budget's line table (preset, rounds setting, round steps, runs) comes from the
    benchmark pipeline's presets and the registry: a line per federated preset, in the order
    the board runs them, and the committed measurements hold exactly those lines."""
    import csv

    derived = board.budget.budget_lines()
    measured = list(csv.DictReader(open(board.budget.BUDGET_FILE), delimiter="\t"))
    assert [(x["preset"], x["rounds_key"], x["round_steps"], int(x["runs"])) for x in measured] == [
        (preset, *line) for preset, line in derived.items()
    ]
    assert derived["bench_fedmoco_lw"] == ("method.federation.rounds", "grow_*", 9)
    assert derived["bench_cpcfl"] == ("method.federation.rounds", "cfl", 12)
    assert "bench_random_init" not in derived  # it federates nothing
    assert board.budget.round_step_names() == {
        "pretrain",
        "train",
        "cfl",
        "grow_1",
        "grow_2",
        "grow_3",
    }


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
    run through Snakemake (the seed-0 runs made already), and its board rendered."""
    root = made_tiny_project(tmp_path_factory.mktemp("board"))
    exps = root / "params" / "experiments"
    for base in ("tiny_simclr", "tiny_random"):
        (exps / f"{base}_s1.yaml").write_text(TINY_SEED.format(base=base, seed=1))
    with open(root / "params" / "pipelines.yaml", "a") as f:
        f.write("  board: [tiny_simclr, tiny_simclr_s1, tiny_random, tiny_random_s1]\n")
    run(["snakemake", "--cores", "2", "--config", "pipeline=board"], root)
    run(["python", "-m", "fedssl.reporting.board", "render", "board"], root)
    return root


@pytest.mark.timeout(1800)  # a minute on idle cores; 8 stage processes and the report
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
    # the wall seconds stay in board.json; the table shows the simulated seconds per round
    page = (folder / "board.md").read_text()
    assert simclr["client_MB_exchanged_mean"] > 0 and simclr["sim_s_phone_mean"] > 0
    assert "s / round, phone (sim.)" in page and "| wall s |" not in page
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


def test_the_second_boards_plan_covers_its_pipeline_with_equal_rounds_per_family():
    """benchmarks/board_plan.tsv: a line for every grid (or variant) of the `board`
    pipeline, its runs and rounds as the presets set them, the same rounds within a family,
    and its parts the pipelines board_p1.. that together make the board."""
    from fedssl.presets import Presets, lookup

    presets = Presets()
    members = presets.grid_members("experiment")
    plan = board.budget.plan_table()
    by_line: dict[str, list[str]] = {}
    for e in presets.pipeline_experiments("board"):
        by_line.setdefault(board.budget.line_of(e, members), []).append(e)
    assert {x["grid"] for x in plan} == set(by_line) and len(plan) == len(by_line)
    parts: dict[str, list[str]] = {}
    for x in plan:
        runs = by_line[x["grid"]]
        assert int(x["runs"]) == len(runs), x["grid"]
        for e in runs:
            params = presets.load("experiment", e).model_dump(mode="json")
            if x["rounds_key"]:
                assert lookup(params, x["rounds_key"]) == int(x["rounds"]), e
        parts.setdefault(x["part"], []).extend(runs)
    for part, runs in parts.items():
        assert sorted(presets.pipeline_experiments(part)) == sorted(runs), part
    rounds = {x["grid"]: int(x["rounds"]) for x in plan}
    family = {  # equal rounds within a family; a reference (its network at init) trains none
        50: [g for g in rounds if g.split(":")[0] in {
            "board_fedsimclr", "board_fedbyol", "board_fedema", "board_fedu", "board_orchestra",
            "board_featarc", "board_supervised", "board_mfcl", "board_sfl"}],
        15: [g for g in rounds if g.split(":")[0] in {
            "board_fedmoco", "board_fedmoco_lw", "board_lw_fedssl", "board_prog_fedssl"}],
        100: [g for g in rounds if g.startswith("board_personal")],
        0: [g for g in rounds if g.split(":")[0] in {
            "board_random_init", "board_mfcl_init", "board_vit_init", "board_sfl_init"}],
    }  # fmt: skip
    for n, grids in family.items():
        assert grids and {rounds[g] for g in grids} == {n}, n
    # each part fits a session of the 2-core CPU (two stages at a time)
    hours = {}
    for x in plan:
        hours[x["part"]] = hours.get(x["part"], 0) + x["estimate_s"] / 2 / 3600
    assert max(hours.values()) < 3 and 10 < sum(hours.values()) < 13


def test_plan_estimates_from_measured_times(tmp_path):
    """Per-round and fixed seconds from per-stage wall times, then a line's estimate."""
    runs = tmp_path / "runs.tsv"
    runs.write_text(
        "# header line\nexperiment\tstage\twall_seconds\n"
        "g_a_s0\tpretrain\t20\ng_a_s0\tevaluate\t3\ng_a_s1\tpretrain\t30\ng_a_s1\tcosts\t5\n"
    )
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"rows": [{"experiment": "g_a_s0", "rounds": 4},
                                           {"experiment": "g_a_s1", "rounds": 5}]}))  # fmt: skip
    members = {"g_a_s0": ("g", {"bench_seed": "0"}), "g_a_s1": ("g", {"bench_seed": "1"})}
    measured = board.budget.measured_times(runs, report, members)
    assert measured == {"g": {"round_s": 5.5, "fixed_s": 4.0}}  # (20/4 + 30/5) / 2; 8 / 2
    plan = tmp_path / "plan.tsv"
    plan.write_text(
        "part\tgrid\tmeasured_as\trounds_key\trounds\truns\tround_scale\tmonitor_calls\n"
        "p\tnew\tg\tmethod.rounds\t10\t3\t2\t5\n"
    )
    (line,) = board.budget.plan_table(plan, measured)
    assert line["run_s"] == 10 * 5.5 * 2 + 4.0 + 5 * board.budget.MONITOR_CALL_S
    assert line["estimate_s"] == round(3 * line["run_s"])
    plan.write_text(plan.read_text().replace("\tg\t", "\tnone\t"))
    with pytest.raises(KeyError, match="measured_as 'none'"):
        board.budget.plan_table(plan, measured)


def test_the_second_board_names_no_stage_of_a_committed_pipeline():
    """The board's presets sort before most others, and a stage is named after the first
    experiment that has its content: none of theirs may take over a stage of a pipeline
    whose results are committed (its results would move); the GPU subset plans the whole
    training split."""
    from fedssl.plan.dag import Dag

    for pipeline in ("default", "benchmark", "gpu"):
        owners = {s.split("__", 1)[1] for s in Dag(pipeline).stages if "__" in s}
        assert not [o for o in owners if o.startswith("board_")], pipeline
    gpu = Dag("board_gpu")
    assert {s for s in gpu.stages if s.startswith("partition__")} == {
        "partition__gpubench_fmnist_dir01_m10",
        "partition__fmnist_dir01_m10",  # the untrained twin's (fmnist_random_init) partition
    }


def test_curves_read_every_round_log_and_name_the_diverged_run(tmp_path):
    """plot_curves: a layer-wise run's growth-stage logs read as one run (rounds renumbered),
    a TSV that is not a round log is left out, and a run whose loss explodes and stops
    early is returned as diverged (and drawn as a marked end point), as is a run its report
    lists as stopped with an error whose log looks whole."""
    from fedssl.reporting.report import plot_curves, read_round_log

    def tsv(name, header, rows):
        path = tmp_path / name
        path.write_text(
            "\t".join(header) + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows)
        )
        return path

    grow = [tsv(f"g{s}.tsv", ["round", "loss"], [[1, 3.0 - s], [2, 2.5 - s]]) for s in (1, 2)]
    other = tsv("epochs.tsv", ["epoch", "loss"], [[1, 9.0]])
    assert [(r["round"], float(r["loss"])) for r in read_round_log([*grow, other])] == [
        ("1", 2.0), ("2", 1.5), ("3", 1.0), ("4", 0.5)
    ]  # fmt: skip
    logs = {
        f"a_s{i}": tsv(f"a{i}.tsv", ["round", "loss"], [[1, 2.0], [2, 1.0], [3, 0.5]])
        for i in range(2)
    }
    logs["a_s2"] = tsv("a2.tsv", ["round", "loss"], [[1, 2.0], [2, 3.7e13]])
    labels = {f"a_s{i}": ("A", "IID") for i in range(2)}  # a_s2 failed: no row, its seeds' label
    gone = plot_curves(logs, tmp_path / "curves.png", labels)
    assert gone == ["A / IID #2"] and (tmp_path / "curves.png").stat().st_size > 0
    # a run that stopped with an error after a whole, finite log is marked all the same
    gone = plot_curves(logs, tmp_path / "curves.png", labels, stopped={"a_s1"})
    assert gone == ["A / IID #1", "A / IID #2"]


def test_accuracy_over_the_run_gives_each_encoder_its_own_row_where_a_panel_mixes_them():
    """A partition's encoder lines on two backbones get a row each (named by the encoder); a
    panel whose curves share one backbone keeps its single row."""
    rows = [
        {**_row(f"{m}_s0", m, "X", knn_top1=60.0), "arch": arch, "evaluation": "ssl"}
        for m, arch in [("A", "cnn"), ("B", "cnn"), ("V", "vit")]
    ]
    cells = board.cells.cells(rows, {})
    row_of = board.figures._over_run_rows(cells)
    assert {c["method"]: row_of(c) for c in cells} == {
        "A": "X · encoders · cnn", "B": "X · encoders · cnn", "V": "X · encoders · vit"
    }  # fmt: skip
    one = board.figures._over_run_rows(cells[:2])
    assert {one(c) for c in cells[:2]} == {"X · encoders"}


def test_a_monitor_without_a_round_0_reading_targets_its_untrained_references_knn_plus_3():
    """The split ResNet's monitor logs no round 0: its target is the untrained reference
    line's k-NN top-1 + 3 (a run that logs round 0 keeps its own reading)."""
    ref = [
        {**_row(f"init_s{i}", "init", "X", knn_top1=44.0 + 2 * i, linear_top1=48.0,
                rounds=0), "evaluation": "ssl"}
        for i in range(2)
    ]  # fmt: skip
    mine = _ssl_runs("M", knn_top1=70.0, linear_top1=70.0, client_MB_up=1.0, client_GFLOPs=10.0)
    logs = {
        "m_s0": [{"round": 1, "knn_monitor": 40.0}, {"round": 2, "knn_monitor": 48.0}],
        "m_s1": [
            {"round": 1, "knn_monitor_round0": 50.0, "knn_monitor": 52.0},
            {"round": 2, "knn_monitor": 54.0},
        ],
    }
    cells = board.cells.cells(ref + mine, {})
    refs = {
        (c["evaluation"], c["encoder"], c["partition"]): c
        for c in cells
        if board.cells.is_reference(c)
    }
    line = next(c for c in cells if c["method"] == "M")
    assert board.cells.targets_of(line, refs, logs) == [45.0 + 3.0, 53.0]
    board.cells.rounds_to_target(cells, logs)
    assert line["to_target"]["reached"] == 2 and line["to_target"]["target"] == 50.5


def test_a_reference_far_cheaper_than_every_method_goes_to_the_edge_with_its_cost():
    """MFCL's untrained stem exports in ~10 GFLOPs against the methods' hundreds: drawn on the
    panel's left edge, labelled with its cost, not a point stretching the log axis; a
    reference within the methods' range stays a (hollow) point."""
    points = [
        {"x": 9.2, "y": 70.0, "label": "stem at init", "reference": True},
        {"x": 300.0, "y": 90.0, "label": "SOLO", "reference": True},
        {"x": 500.0, "y": 75.0, "label": "A", "reference": False},
        {"x": 900.0, "y": 76.0, "label": "B", "reference": False},
    ]
    edge = board.figures._far_below(points, "GFLOPs")
    assert [(p["label"], p["x"], p["y"]) for p in edge] == [
        ("stem at init (9.2 GFLOPs)", None, 70.0)
    ]
    assert [p["label"] for p in points] == ["SOLO", "A", "B"]


def _flags(**entries):
    return board.flags.BoardFlags(below_reference="diagnoses.md#below", **entries)


def test_a_line_below_its_zero_cost_reference_is_flagged_and_one_above_is_not():
    """A sits above the untrained twin R of its encoder, B below it (by a point, not
    separably: the board cannot vouch that B's training bought anything): B's accuracy cell
    carries a mark, its note under the table says by how much and links the diagnosis; A, and
    the reference itself, carry none."""
    rows = (
        _line("A", [80.0, 82.0, 81.0])
        + _line("B", [70.0, 70.5, 70.0])
        + _line("R", [70.0, 72.0, 71.5], mb=0.0)
    )
    cells = board.cells.cells(rows, {})
    board.significance.compare_lines(cells)
    board.flags.flag_lines(cells, _flags())
    got = {c["method"]: c for c in cells}
    assert got["A"]["flags"] == [] and got["R"]["flags"] == []
    assert [(f["kind"], f["column"]) for f in got["B"]["flags"]] == [
        ("below reference", "linear_top1")
    ]
    text = board.tables.tables_text(cells, "h", 60.0, links="../docs/")
    assert "| B | cnn | P | 3 | 70.2±0.3 ⚑1 |" in text and "| A | cnn | P | 3 | 81.0±1.0 |" in text
    assert "- ⚑1 Below its zero-cost reference" in text
    assert (
        "**B** (P) against R: −1.0 [−3.2, +1.2] not separable" in text
        and "[Diagnosis](../docs/diagnoses.md#below)" in text
    )
    assert board.significance.metrics(cells)["B | cnn | P"]["flags"] == [
        {"kind": "below reference", "column": "linear_top1", "diagnosis": "diagnoses.md#below"}
    ]
    assert "flags" not in board.significance.metrics(cells)["A | cnn | P"]
    fresh = board.cells.cells(rows, {})
    board.significance.compare_lines(fresh)
    board.flags.flag_lines(fresh, None)  # a pipeline the flags file has no entry for: no flag
    assert "⚑" not in board.tables.tables_text(fresh, "h", 60.0)


def test_a_papers_ordering_is_flagged_where_the_board_inverts_it_and_a_known_column():
    """The paper puts P above Q: on partition X the board has P below Q (flagged, with the
    paired difference), on Y above (not flagged). A known diagnosis of encoder vit's
    fine-tune column marks that column of each of its lines, not their accuracy."""
    rows = []
    for part, p, q in (("X", [60.0, 61.0], [62.0, 64.0]), ("Y", [70.0, 71.0], [65.0, 66.0])):
        rows += [
            _row(f"p_{part}_s{i}", "P", part, linear_top1=v, client_MB_up=1.0)
            for i, v in enumerate(p)
        ]
        rows += [
            _row(f"q_{part}_s{i}", "Q", part, linear_top1=v, client_MB_up=1.0)
            for i, v in enumerate(q)
        ]
    rows += [
        _row(f"v_s{i}", "V", "X", linear_top1=70.0, finetune_top1=30.0, client_MB_up=1.0)
        for i in (0, 1)
    ]
    for r in rows[-2:]:
        r["arch"] = "vit"
    flags = _flags(
        orderings=[
            {"above": "P", "below": "Q", "paper": "Tab. 3: 65 against 60", "diagnosis": "d.md#p"}
        ],
        known=[
            {
                "encoder": "vit",
                "column": "finetune_top1",
                "says": "fine-tuned low",
                "diagnosis": "l.md",
            }
        ],
    )
    cells = board.cells.cells(rows, {})
    board.significance.compare_lines(cells)
    board.flags.flag_lines(cells, flags)
    got = {(c["method"], c["partition"]): c["flags"] for c in cells}
    assert [f["kind"] for f in got["P", "X"]] == ["inverted"]
    assert got["P", "Y"] == [] and got["Q", "X"] == [] and got["Q", "Y"] == []
    assert [(f["kind"], f["column"]) for f in got["V", "X"]] == [("known", "finetune_top1")]
    text = board.tables.tables_text(cells, "h", 60.0)
    assert "| V | vit | X | 2 | 70.0±0.0 | [70.0, 70.0] | best |  | 30.0±0.0 ⚑2 | 1 |" in text
    assert (
        "- ⚑1 The paper puts P above Q (Tab. 3: 65 against 60); here it is below, in points "
        "(paired by seed, 95 % interval): **P** (X) −2.5 [−8.9, +3.9]. [Diagnosis](d.md#p)"
    ) in text
    assert "- ⚑2 Fine-tuned low: **V** (X). [Diagnosis](l.md)" in text


def test_a_known_flag_on_a_cost_column_marks_that_cost_cell():
    """A diagnosis of a line's local steps (the batch-size outlier) marks its steps cell and
    names the line in the note; its accuracy cell carries no mark."""
    rows = _line("O", [78.0, 77.0]) + _line("S", [74.0, 75.0])
    for r in rows:
        r["local_steps"] = 19 if r["row"] == "O" else 5
    flags = _flags(
        known=[{"method": "O", "column": "local_steps", "says": "batch 32", "diagnosis": "o.md"}]
    )
    cells = board.cells.cells(rows, {})
    board.significance.compare_lines(cells)
    board.flags.flag_lines(cells, flags)
    text = board.tables.tables_text(cells, "h", 60.0)
    (o_row,) = [line for line in text.splitlines() if line.startswith("| O |")]
    assert "| 19 ⚑1 |" in o_row and "77.5±0.7 |" in o_row and "77.5±0.7 ⚑" not in o_row
    assert "| 5 |" in next(line for line in text.splitlines() if line.startswith("| S |"))
    assert "- ⚑1 Batch 32: **O** (P). [Diagnosis](o.md)" in text


def test_a_lines_local_steps_come_from_its_params_rounded_up_per_batch():
    """600 images a client (6,000 over 10 clients) at one local epoch: Orchestra's batch of 32
    takes 19 steps a round, FedSimCLR's 128 takes 5, the supervised lines' 64 take 10 (each
    rounded up: the last batch is partial); a method whose federation block has no epochs and
    batch of the common settings (MFCL, MpFedcon) and an unknown experiment get none."""
    from fedssl.presets import Presets
    from fedssl.reporting.board.steps import local_steps, with_local_steps

    presets = Presets()
    steps = {
        name: local_steps(f"board_{name}_dir01_s0", presets)
        for name in ("orchestra", "fedsimclr", "fedavg", "mfcl_tn", "fedrep")
    }
    assert steps == {"orchestra": 19, "fedsimclr": 5, "fedavg": 10, "mfcl_tn": None, "fedrep": None}
    assert local_steps("no_such_experiment", presets) is None
    rows = [{"experiment": "board_orchestra_shards2_s1"}, {"experiment": "board_mfcl_tn_iid_s0"}]
    assert with_local_steps(rows, presets) == [rows[0] | {"local_steps": 19}, rows[1]]


def test_a_flags_file_that_names_no_line_or_a_wrong_field_stops_naming_it(tmp_path):
    """A flag for a line the board does not have (a typo would silently flag nothing), or a
    misspelt field, stops the rendering with the file and the field; a pipeline the file has
    no entry for, or no file, flags nothing."""
    path = tmp_path / "flags.yaml"
    path.write_text(
        "board:\n  below_reference: d.md\n"
        "  orderings: [{above: P, below: Qx, paper: t, diagnosis: d}]\n"
    )
    cells = board.cells.cells(_line("P", [1.0, 2.0]), {})
    with pytest.raises(ParamsError, match=r"flags.yaml: orderings.0.below: no line .* 'Qx'"):
        board.flags.flag_lines(cells, board.flags.load_flags("board", path), path)
    path.write_text(
        "board:\n  below_reference: d.md\n  known: [{method: P, colum: x, says: s, diagnosis: d}]\n"
    )
    with pytest.raises(ParamsError, match=r"flags.yaml: board.known.0.colum: Extra inputs"):
        board.flags.load_flags("board", path)
    assert (
        board.flags.load_flags("other", path) is None
        and board.flags.load_flags("b", tmp_path / "no") is None
    )
    # on a board made part by part, a flag may name a line whose runs are still to come
    path.write_text(
        "board:\n  below_reference: d.md\n"
        "  orderings: [{above: P, below: Q, paper: t, diagnosis: d}]\n"
    )
    flags = board.flags.load_flags("board", path)
    coming = [{"experiment": "q_s0", "row": "Q", "arch": "cnn", "column": "P"}]
    board.flags.flag_lines(cells, flags, path, to_come=coming)
    assert cells[0]["flags"] == []
    with pytest.raises(ParamsError, match=r"orderings.0.below: no line .* 'Q'"):
        board.flags.flag_lines(cells, flags, path, to_come=[coming[0] | {"row": "R"}])
    # an untrained run to come takes its title as its row: the flag may name it by the title
    titled = [coming[0] | {"row": "R", "title": "Q"}]
    board.flags.flag_lines(cells, flags, path, to_come=titled)
    assert cells[0]["flags"] == []


def test_the_committed_board_flags_every_line_below_its_reference_and_the_inversions():
    """The committed second board, as rendered: a line is flagged below its reference exactly
    where its paired difference from it is negative, each paper ordering of the flags file is
    flagged exactly where its line's mean is below the other's, and every flag links a page
    of the docs (its anchor, where it names one, a heading id of that page)."""
    lines = json.loads(Path("results/reports/board/board.json").read_text())["lines"]
    flags = board.flags.load_flags("board")
    accuracies = [c for _, columns in board.cells.EVALUATIONS.values() for c in columns]
    for key, line in lines.items():
        kinds = [f["kind"] for f in line.get("flags", [])]
        below = line.get("vs_reference", {}).get("difference", 0) < 0
        assert ("below reference" in kinds) == below, key
        method, _, partition = key.split(" | ")
        for order in flags.orderings:
            other = next(
                (
                    v
                    for k, v in lines.items()
                    if k.startswith(f"{order.below} | ") and k.endswith(f" | {partition}")
                ),
                None,
            )
            if method == order.above and other:
                accuracy = next(c for c in accuracies if f"{c}_mean" in line)
                inverted = line[f"{accuracy}_mean"] < other[f"{accuracy}_mean"]
                assert ("inverted" in kinds) == inverted, key
    assert sum("inverted" in str(v.get("flags")) for v in lines.values()) == 8
    for link in {f["diagnosis"] for v in lines.values() for f in v.get("flags", [])}:
        page, _, anchor = link.partition("#")
        text = (Path("docs/results") / page).read_text()
        assert not anchor or "{#" + anchor + "}" in text, link


def test_the_accuracy_over_the_run_is_faceted_by_question_family_highest_lines_first():
    """With a plan, a line's row is its partition and the first family that asks about it
    (a line, its reference, a contrast's side; a pool only lends noise), the family's lines
    split into rows of at most six from the highest accuracy down (lines that end close share
    a zoomed axis); a line no family asks about, or a partition the plan lacks, keeps its
    panel's row."""
    plan = board.questions.BoardQuestions.model_validate(
        {
            "partitions": ["X"],
            "families": {
                "vs_solo": {"says": "s", "evaluation": "personal", "reference": "SOLO",
                            "lines": [f"L{i}" for i in range(7)]},
                "pair": {"says": "s", "evaluation": "personal", "contrasts": [["L0", "K"]],
                         "pool": ["P"]},
            },
        }
    )  # fmt: skip
    families = board.questions.line_families(plan)
    assert families[("personal", "X", "SOLO")] == "vs_solo"
    assert families[("personal", "X", "L0")] == "vs_solo"  # its first family
    assert families[("personal", "X", "K")] == "pair" and ("personal", "X", "P") not in families
    names = ["SOLO", *(f"L{i}" for i in range(7)), "K", "P"]
    rows = [
        _row(f"{m}_s0", m, part, personal_last10=90.0 + i / 10, arch="cnn")
        for part in ("X", "Y")
        for i, m in enumerate(names)
    ]
    cells = board.cells.cells(rows, {})
    row_of = board.figures._over_run_rows(cells, families)
    got = {c["method"]: row_of(c) for c in cells if c["partition"] == "X"}
    top = [m for m in got if got[m] == "X · vs_solo · lines 1 of 2"]
    assert sorted(top) == ["L3", "L4", "L5", "L6"]  # the highest four of the eight
    assert got["SOLO"] == got["L0"] == "X · vs_solo · lines 2 of 2"
    assert got["K"] == "X · pair" and got["P"] == "X · personalised"
    assert {row_of(c) for c in cells if c["partition"] == "Y"} == {
        "Y · personalised · lines 1 of 2", "Y · personalised · lines 2 of 2"
    }  # fmt: skip


def test_a_family_split_in_rows_draws_its_highest_lines_first(tmp_path, monkeypatch):
    """The reference (listed first on the board, at the lowest accuracy) falls in the second
    row of a family of eight lines: the figure still draws "lines 1 of 2" above "lines 2 of 2"."""
    names = ["SOLO", *(f"L{i}" for i in range(7))]
    rows = [
        _row(f"{m}_s0", m, "X", personal_last10=90.0 + i / 10, arch="cnn")
        for i, m in enumerate(names)
    ]
    cells = board.cells.cells(rows, {})
    row_of = board.figures._over_run_rows(cells, {})
    curve = [[(r, 80.0 + r, r, r, r) for r in (1.0, 2.0)]]
    drawn = []
    monkeypatch.setattr(
        "fedssl.reporting.figures.learning_curves", lambda panels, *a, **k: drawn.extend(panels)
    )
    members = [(c, curve) for c in cells]
    assert board.figures._plot_family_over_run(members, tmp_path / "f.png", "x", row_of)
    order = list(dict.fromkeys(name.split("\n")[0] for name in drawn))
    assert order == ["X · personalised · lines 1 of 2", "X · personalised · lines 2 of 2"]


def test_lines_sharing_a_panel_get_hues_apart_and_a_zoomed_axis_separates_close_ends(tmp_path):
    """Seven lines in two panels sharing one line: every panel's lines in different tab10
    hues (no dark hue beside its light twin); a panel whose lines end between 89 and 96 %
    after starting at 10 % is drawn on about 88-97 %, not 0-100 %, when zoomed; each
    keyed panel carries its own lines' key."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from fedssl.reporting import figures

    panels = [["A", "B", "C", "D"], ["D", "E", "F", "G"]]
    colours = figures.colours_apart(plt, panels)
    for names in panels:
        assert len({colours[n] for n in names}) == len(names)
    assert set(colours.values()) <= {plt.get_cmap("tab10")(h) for h in range(10)}
    rounds = list(range(20))
    ends = {"A": 89.0, "B": 92.0, "C": 94.0, "D": 96.0}
    lines = {
        m: [(rounds, [10 + (end - 10) * min(1, r / 5) for r in rounds])] for m, end in ends.items()
    }
    seen = {}
    original = figures._curve_panel

    def spy(ax, name, *args, **kwargs):
        original(ax, name, *args, **kwargs)
        seen[name] = (ax.get_ylim(), ax)

    try:
        figures._curve_panel = spy
        figures.learning_curves(
            {"zoomed": lines, "whole": lines},
            {},
            tmp_path / "c.png",
            look=figures.CurveLook(zoom=0.5, keyed=("zoomed",)),
        )
        figures.learning_curves({"whole": lines}, {}, tmp_path / "d.png")
    finally:
        figures._curve_panel = original
    (lo, hi), ax = seen["zoomed"]
    assert 88 < lo < 89 and 96 < hi < 97 and ax.get_legend() is not None
    assert seen["whole"][0][0] < 10 and seen["whole"][1].get_legend() is None
