"""The board's planned questions: the pooled and blocked linear models, the minimum detectable
effect, Benjamini-Hochberg, the questions file's validation, and what the committed board's
rows answer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from fedssl.reporting import board, stats
from fedssl.reporting.board import questions
from fedssl.stage.record import ParamsError


def _runs(**lines):
    return [(name, str(s), v) for name, values in lines.items() for s, v in enumerate(values)]


def test_pooled_model_borrows_every_lines_noise():
    """Sample variances 1, 1 and 4 on 2 df each: pooled 2 on 6 df; B - A = 3 with se
    sqrt(2 (1/3 + 1/3)); a line of one run is compared under the others' variance."""
    model = stats.LineModel(_runs(A=[1, 2, 3], B=[4, 5, 6], C=[10, 12, 14]))
    assert model.df == 6 and model.variance == pytest.approx(2.0)
    c = model.contrast("B", "A")
    se = math.sqrt(2.0 * 2 / 3)
    assert (c.difference, c.se, c.df) == (pytest.approx(3.0), pytest.approx(se), 6)
    assert c.p == pytest.approx(2 * sps.t.sf(3 / se, 6))
    half = sps.t.ppf(0.975, 6) * se
    assert c.interval == (pytest.approx(3 - half), pytest.approx(3 + half))
    single = stats.LineModel(_runs(A=[1, 2, 3], B=[4, 5, 6], D=[7])).contrast("D", "A")
    assert single.difference == pytest.approx(5.0) and single.df == 4
    assert single.se == pytest.approx(math.sqrt(1.0 * (1 + 1 / 3)))
    assert stats.LineModel(_runs(A=[1.0], B=[2.0])).contrast("A", "B") is None  # no df


def test_blocked_model_removes_a_shift_every_line_shares():
    """Seeds that draw the partition shift both lines by 0, 4, 8: pooled, B - A = 1 drowns in
    a variance of 16; with a block per seed the shift is gone and the difference is exact."""
    runs = _runs(A=[1, 5, 9], B=[2, 6, 10])
    assert stats.LineModel(runs).contrast("B", "A").p > 0.5
    blocked = stats.LineModel(runs, blocked=True)
    assert blocked.df == 2 and blocked.contrast("B", "A").p < 1e-12
    assert blocked.contrast("B", "A").difference == pytest.approx(1.0)


def test_minimum_detectable_effect_has_the_power_it_claims():
    """Ten lines of three runs (sigma 1, df 20): a true difference equal to the MDE at
    alpha/9 is rejected in ~80 % of simulated boards; at large df the MDE is the normal
    approximation (z_0.975 + z_0.8) se."""
    rng = np.random.default_rng(0)
    names = [f"L{i}" for i in range(10)]
    mde = None
    hits, sims = 0, 1500
    for _ in range(sims):
        runs = [(n, str(s), rng.normal(0.0, 1.0)) for n in names for s in range(3)]
        model = stats.LineModel(runs)
        if mde is None:  # se does not depend on the draw: sigma sqrt(2/3)
            se = math.sqrt(2 / 3)
            mde = stats.minimum_detectable(se, 20, 0.05 / 9)
        shifted = stats.LineModel([(n, s, v + (mde if n == "L1" else 0)) for n, s, v in runs])
        hits += shifted.contrast("L1", "L0").p < 0.05 / 9
        del model
    assert hits / sims == pytest.approx(0.8, abs=0.035)
    big = stats.minimum_detectable(1.0, 10**6)
    assert big == pytest.approx(sps.norm.ppf(0.975) + sps.norm.ppf(0.8), abs=1e-3)
    assert stats.minimum_detectable(0.0, 5) == 0.0


def test_benjamini_hochberg_on_known_values():
    got = stats.benjamini_hochberg([0.01, 0.04, 0.03, 0.2, None])
    assert got[:4] == [
        pytest.approx(0.04),
        pytest.approx(0.04 * 4 / 3),
        pytest.approx(0.04 * 4 / 3),
        pytest.approx(0.2),
    ]
    assert got[4] is None
    assert stats.benjamini_hochberg([0.9, 0.8]) == [pytest.approx(0.9), pytest.approx(0.9)]


def _cells(partition_of=lambda s: "bench"):
    rows = []
    for method, values in {
        "R": [70.0, 71.0, 72.0],
        "A": [75.0, 76.0, 77.0],
        "B": [71.0, 72.5, 72.0],
        "C": [70.5, 71.0, 71.0],
    }.items():
        for s, v in enumerate(values):
            rows.append(
                {"experiment": f"{method}_s{s}", "row": method, "arch": "cnn", "column": "P"}
                | {"partition": partition_of(s), "linear_top1": v, "client_MB_up": 1.0}
                | ({"client_MB_up": 0.0} if method == "R" else {})
            )
    return board.cells.cells(rows, {})


PLAN = {
    "partitions": ["P"],
    "families": {
        "twin": {"says": "s", "evaluation": "ssl", "reference": "R", "lines": ["A", "B", "C"]},
        "ab": {"says": "s", "evaluation": "ssl", "contrasts": [["A", "B"]], "pool": ["C", "R"]},
    },
}


def test_a_family_is_answered_under_its_pooled_variance_and_holm_within_it():
    """Three lines against their reference (pooled SD 0.67 on 8 df): A (+5) and B (+0.8 ...)
    adjusted by Holm over the family's three questions, the contrast family on its own (m = 1,
    variance pooled over all four lines); each answer lands in the line's vs reference."""
    cells = _cells()
    board.significance.compare_lines(cells)
    plan = questions.BoardQuestions.model_validate(PLAN)
    answers = questions.ask(cells, plan)
    twin = [a for a in answers if a["family"] == "twin"]
    model = stats.LineModel(
        [(c["method"], s, v) for c in cells for s, v in c["by_seed"]["linear_top1"].items()]
    )
    raw = [model.contrast(m, "R").p for m in "ABC"]
    assert [a["p_adj"] for a in twin] == [pytest.approx(p, abs=1e-6) for p in stats.holm(raw)]
    assert [a["verdict"] for a in twin] == ["separable", "not separable", "not separable"]
    assert twin[0]["difference"] == pytest.approx(5.0) and twin[0]["test"] == "pooled t, df 8"
    assert twin[0]["mde"] == pytest.approx(
        stats.minimum_detectable(model.contrast("A", "R").se, 8, 0.05 / 3), abs=1e-4
    )
    ab = next(a for a in answers if a["family"] == "ab")
    assert ab["p_adj"] == pytest.approx(model.contrast("A", "B").p, abs=1e-6)
    got = {c["method"]: c for c in cells}
    assert got["C"]["vs_reference"]["family"] == "twin"
    text = board.significance.verdict_text(got["C"]["vs_reference"])
    assert f"not separable, MDE {twin[2]['mde']:.1f}" in text
    table = questions.questions_text(answers, plan)
    assert "- twin: 1 of 3 separable, 1 resolved" in table
    assert "| twin | A | R | +5.0 [" in table


def test_a_seed_that_draws_its_partition_is_its_own_block():
    cells = _cells(partition_of=lambda s: f"draw{s}")
    assert questions._runs(cells[0])[0] == ("R", "draw0/0", 70.0)


@pytest.mark.parametrize(
    "family, message",
    [
        ({"says": "s", "evaluation": "ssl", "reference": "R"}, ": Value error, reference and"),
        ({"says": "s", "evaluation": "ssl", "lines": {"A": "R"}, "reference": "R"}, ": Value"),
        ({"says": "s", "evaluation": "ssl"}, ": Value error, a family asks at least one"),
        ({"says": "s", "evaluation": "ssl", "contrast": [["A", "B"]]}, r"\.contrast: Extra"),
        ({"says": "s", "evaluation": "x", "contrasts": [["A", "B"]]}, r"\.evaluation: Input"),
    ],
)
def test_a_bad_questions_file_names_the_field(tmp_path, family, message):
    path = tmp_path / "q.yaml"
    path.write_text(json.dumps({"board": {"partitions": ["P"], "families": {"f": family}}}))
    with pytest.raises(ParamsError, match=rf"q\.yaml: board\.families\.f{message}"):
        questions.load_questions("board", path)


def test_a_question_on_a_line_the_board_lacks_names_its_field():
    cells = _cells()
    plan = questions.BoardQuestions.model_validate(
        PLAN | {"families": {"x": {"says": "s", "evaluation": "ssl", "contrasts": [["A", "Z"]]}}}
    )
    with pytest.raises(ParamsError, match=r"q.yaml: board.families.x.contrasts.0: no ssl line 'Z'"):
        questions.ask(cells, plan, "q.yaml: board")
    plan.families["x"].contrasts = [("A", "B")]
    plan.families["x"].pool = ["Y"]
    with pytest.raises(ParamsError, match=r"families.x.pool.0: no ssl line 'Y'"):
        questions.ask(cells, plan)


def test_the_committed_board_answers_its_planned_questions():
    """The committed board.json's answers are what the committed rows give, and on ξ = 0.1
    the small CNN's 9 lines against their untrained twin separate 8 times (the paired test
    with Holm over the partition separated none of them)."""
    rows = json.loads(Path("results/reports/board/report.json").read_text())["rows"]
    cells = board.cells.cells(rows, {})
    board.significance.compare_lines(cells)
    answers = questions.ask(cells, questions.load_questions("board"))
    committed = json.loads(Path("results/reports/board/board.json").read_text())["questions"]
    assert answers == committed
    twin = [a for a in answers if a["family"] == "small_cnn_vs_twin" and "0.1" in a["partition"]]
    assert len(twin) == 9 and sum(a["verdict"] == "separable" for a in twin) == 8
    assert sum(a["resolved"] for a in twin) == 8
    assert {a["line"] for a in twin if a["verdict"] != "separable"} == {"FeatARC"}
