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

from fedssl.eval.predictions import write_predictions
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


def _cells(partition_of=lambda s: "bench", drop=()):
    rows = []
    for method, values in {
        "R": [70.0, 71.0, 72.0],
        "A": [75.0, 76.0, 77.0],
        "B": [71.0, 72.5, 72.0],
        "C": [70.5, 71.0, 71.0],
    }.items():
        for s, v in enumerate(values):
            if f"{method}_s{s}" in drop:
                continue
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


def test_a_paired_family_takes_each_questions_noise_from_its_two_lines_alone():
    """Lines of unequal noise (B and R quiet, C noisy): a paired question is the paired t over
    the blocks both lines ran (scipy's ttest_rel, n - 1 df), whatever the family's other lines;
    the blocked model pools C's noise into B's question and loses it. A paired family lends
    no noise, so a pool beside it is refused; a family inherits the board's variance."""
    cells = _cells(partition_of=lambda s: f"draw{s}")
    noisy = {"0": 60.0, "1": 75.0, "2": 90.0}
    next(c for c in cells if c["method"] == "C")["by_seed"]["linear_top1"] = noisy
    family = {"says": "s", "evaluation": "ssl", "reference": "R", "lines": ["B", "C"]}
    answers = {}
    for variance in ("paired", "blocked"):
        plan = questions.BoardQuestions.model_validate(
            {"partitions": ["P"], "families": {"f": family | {"variance": variance}}}
        )
        answers[variance] = questions.ask(cells, plan)
    first = answers["paired"][0]
    by_seed = {c["method"]: c["by_seed"]["linear_top1"] for c in cells}
    expected = sps.ttest_rel(list(by_seed["B"].values()), list(by_seed["R"].values()))
    assert first["p"] == pytest.approx(expected.pvalue, abs=1e-6)
    assert first["test"] == "paired t, df 2"
    assert answers["blocked"][0]["test"] == "blocked t, df 4"
    assert answers["blocked"][0]["p"] > 3 * first["p"]  # C's noise widened B's question
    pooled = {"says": "s", "evaluation": "ssl", "contrasts": [["B", "C"]], "pool": ["A"]}
    board = {"partitions": ["P"], "variance": "paired", "families": {"f": pooled}}
    with pytest.raises(ValueError, match="families.f.pool: a paired question takes its noise"):
        questions.BoardQuestions.model_validate(board)
    board["families"]["f"] |= {"variance": "blocked"}  # a family may keep its own
    assert questions.BoardQuestions.model_validate(board).families["f"].variance == "blocked"


def test_a_family_is_asked_only_on_its_partitions():
    """A family restricted to some of the board's partitions (a part that runs only some
    lines, such as the 100-client one) asks nothing elsewhere, so the lines it would lack
    there stop nothing; a partition the board does not have is refused, naming the family."""
    cells = _cells()  # every line on partition P; none on Q
    on_p = {name: f | {"partitions": ["P"]} for name, f in PLAN["families"].items()}
    plan = questions.BoardQuestions.model_validate(
        PLAN | {"partitions": ["P", "Q"], "families": on_p}
    )
    answers = questions.ask(cells, plan)
    assert {(a["family"], a["partition"]) for a in answers} == {("twin", "P"), ("ab", "P")}
    assert not any(p == "Q" for _, p, _ in questions.line_families(plan))
    everywhere = questions.BoardQuestions.model_validate(PLAN | {"partitions": ["P", "Q"]})
    with pytest.raises(ParamsError, match="no ssl line 'A' on partition 'Q'"):
        questions.ask(cells, everywhere)
    with pytest.raises(ValueError, match=r"families.twin.partitions: \['Q'\] not in"):
        questions.BoardQuestions.model_validate(
            PLAN | {"families": {"twin": PLAN["families"]["twin"] | {"partitions": ["Q"]}}}
        )


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


def test_on_a_partial_board_a_line_still_to_come_waits_and_counts_in_holms_m():
    """Line C's runs not made yet (a board made part by part): its question says "to come",
    the others are answered over the lines present, Holm still adjusts over all three planned
    questions, and C's reference answer is not written into any line; a line neither present
    nor to come still stops the board, and a to-come run may name its line by its title (a run
    that trains no round takes its title as its row where trained runs share its label)."""
    cells = [c for c in _cells() if c["method"] != "C"]
    board.significance.compare_lines(cells)
    plan = questions.BoardQuestions.model_validate(PLAN)
    coming = [{"experiment": "C_s0", "row": "C", "title": "C", "column": "P"}]
    answers = questions.ask(cells, plan, to_come=coming)
    twin = [a for a in answers if a["family"] == "twin"]
    assert [a["verdict"] for a in twin] == ["separable", "not separable", "to come"]
    model = stats.LineModel(
        [(c["method"], s, v) for c in cells for s, v in c["by_seed"]["linear_top1"].items()]
    )
    raw = [model.contrast(m, "R").p for m in "AB"]
    assert [a["p_adj"] for a in twin[:2]] == [
        pytest.approx(p, abs=1e-6) for p in stats.holm([*raw, 1.0])[:2]
    ]
    assert twin[1]["p_adj"] > stats.holm(raw)[1]  # m = 3, not the 2 answered
    table = questions.questions_text(answers, plan)
    assert "| twin | C | R |  |  | to come |" in table and "1 resolved, 1 to come" in table
    with pytest.raises(ParamsError, match="no ssl line 'C'"):
        questions.ask(cells, plan, to_come=[coming[0] | {"column": "Q"}])
    titled = [coming[0] | {"row": "C method", "title": "C"}]
    assert questions.ask(cells, plan, to_come=titled)[2]["verdict"] == "to come"
    # a run of B still to come: B's answer stands over its runs so far, marked partial
    more = questions.ask(cells, plan, to_come=[*coming, coming[0] | {"row": "B"}])
    assert [bool(a.get("partial")) for a in more[:2]] == [False, True]
    table = questions.questions_text(more, plan)
    assert "| not separable so far (runs to come) |" in table and ", 2 to come" in table


def test_a_line_too_short_to_test_whose_runs_are_to_come_is_to_come_not_untested():
    """Paired, a line with one run made is untested; with its other runs still to come, its
    question waits for them instead."""
    cells = _cells(drop=("B_s1", "B_s2"))
    plan = questions.BoardQuestions.model_validate(
        PLAN | {"families": {"twin": PLAN["families"]["twin"] | {"variance": "paired"}}}
    )
    board.significance.compare_lines(cells)
    verdicts = [a["verdict"] for a in questions.ask(cells, plan)]
    coming = [{"experiment": "B_s1", "row": "B", "title": "B", "column": "P"}]
    waiting = [a["verdict"] for a in questions.ask(cells, plan, to_come=coming)]
    assert verdicts[1] == "untested" and waiting[1] == "to come"
    assert verdicts[0] == waiting[0] == "separable"


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


def _records(tmp_path, right: dict[str, float], n: int = 400) -> dict:
    """A predictions file per run of the toy board: the first ``right[line]`` share of the
    ``n`` test images right (the lines nest: A's right images include B's), the rest wrong."""
    labels = np.arange(n) % 10
    files = {}
    for method, share in right.items():
        for s in range(3):
            guess = labels.copy()
            guess[int(share * n) + s :] = (labels[int(share * n) + s :] + 1) % 10
            path = tmp_path / f"{method}_s{s}.npz"
            write_predictions(path, labels, {"linear_top1": guess})
            files[f"{method}_s{s}"] = {"ssl": path}
    return files


def test_questions_add_the_test_images_where_every_run_kept_them(tmp_path):
    """A against B on the images: A gets 80 % right and B 70 % of the same 400 images, and
    every image B gets right A gets too, so McNemar sees 40 discordant images all one way
    (exact p = 2 x 0.5^40) and the bootstrap's difference is 10 points; a question with a
    line that kept no record says so with a dash, and the count under the table too."""
    cells = _cells()
    plan = questions.BoardQuestions.model_validate(PLAN)
    files = _records(tmp_path, {"A": 0.8, "B": 0.7, "C": 0.7})
    answers = questions.ask(cells, plan, records=files)
    ab = next(a for a in answers if a["family"] == "ab")
    images = ab["test_images"]
    assert images["difference"] == pytest.approx(10.0)
    assert images["ci95"][0] > 5 and images["ci95"][1] < 15
    assert images["mcnemar"]["0"] == [40, 0, pytest.approx(2 * 0.5**40, rel=1e-3)]
    twin = [a for a in answers if a["family"] == "twin"]
    assert all("test_images" not in a for a in twin)  # R kept no record
    text = questions.questions_text(answers, plan)
    assert "+10.0 [" in text and "McNemar p 1.8e−12, 1.8e−12, 1.8e−12 |" in text
    assert "test-image records: 1 of 4 tested questions" in text
    assert "| twin | A | R |" in text and "| — |" in text


def test_without_records_the_questions_say_their_intervals_cover_seeds_only():
    plan = questions.BoardQuestions.model_validate(PLAN)
    text = questions.questions_text(questions.ask(_cells(), plan), plan)
    assert "test-image records: none of the 4 tested questions (their runs were made" in text


def test_personalised_lines_bootstrap_clients_then_images_from_their_step_records(tmp_path):
    """Two personalised lines whose step records (personal.npz, final round) hold 2 clients
    of 10 test images: line A gets 9 and 7 right, B 6 and 6: A - B = mean over clients of
    (90 + 70) / 2 - 60 = +20 points; clients hold their own images, so no McNemar. The
    records are found beside each experiment's stage outputs; a stage without one adds none."""
    from types import SimpleNamespace

    from fedssl.eval.personal import PersonalLog
    from fedssl.reporting.board import imagewise

    def record(folder, right):
        folder.mkdir(parents=True)
        labels = [np.zeros(10, dtype=np.int64)] * 2
        probs = [np.eye(2)[(np.arange(10) >= r).astype(int)] for r in right]
        PersonalLog({}).save(folder / "personal.npz", labels, probs)

    stages, of = {}, {}
    for method, right in (("A", (9, 7)), ("B", (6, 6))):
        for s in range(2):
            exp = f"{method}_s{s}"
            record(tmp_path / exp / "train", right)
            stages[f"train__{exp}"] = SimpleNamespace(out=str(tmp_path / exp / "train"), results=[])
            stages[f"costs__{exp}"] = SimpleNamespace(out=str(tmp_path / exp / "c"), results=[])
            of[exp] = [f"train__{exp}", f"costs__{exp}"]
    dag = SimpleNamespace(experiments=list(of), of_experiment=of, stages=stages)
    files = imagewise.record_files(dag)
    assert files["A_s1"] == {"personal": tmp_path / "A_s1" / "train" / "personal.npz"}
    rows = [_row_p(f"{m}_s{s}", m, v) for m, v in (("A", 80.0), ("B", 60.0)) for s in range(2)]
    a, b = board.cells.cells(rows, {})
    found = imagewise.image_bootstrap(a, b, files, draws=300)
    assert found["difference"] == pytest.approx(20.0) and "mcnemar" not in found
    assert found["ci95"][0] < 20 < found["ci95"][1]
    assert (
        imagewise.image_bootstrap(a, b, {k: v for k, v in files.items() if k != "B_s1"}, 10) is None
    )


def _row_p(experiment, method, value):
    return {"experiment": experiment, "row": method, "arch": "cnn", "column": "P"} | {
        "personal_last3": value
    }


def _answer(line, verdict, difference, partition="P"):
    return {"family": "twin", "partition": partition, "line": line, "against": "R",
            "n": [3, 3], "test": "pooled t, df 8", "difference": difference,
            "ci95": [difference - 1, difference + 1], "mde": 2.0, "verdict": verdict}  # fmt: skip


def test_an_earlier_boards_finding_holds_reverses_or_is_not_confirmed():
    """Each earlier answer against this board's same question: one sign separable on both
    holds, the other sign reverses, separable before and not now is not confirmed, the
    converse is new, a line not run yet, or not all its runs, is to come."""
    from fedssl.reporting.board.revisit import outcome

    sep, not_ = "separable", "not separable"
    assert outcome(_answer("A", sep, 2.0), _answer("A", sep, 0.5)) == "holds"
    assert outcome(_answer("A", sep, -2.0), _answer("A", sep, -0.5)) == "holds"
    assert outcome(_answer("A", sep, 2.0), _answer("A", sep, -0.5)) == "reversed"
    assert outcome(_answer("A", sep, 2.0), _answer("A", not_, 1.5)) == "not confirmed"
    assert outcome(_answer("A", not_, 0.2), _answer("A", sep, 1.5)) == "newly separable"
    assert outcome(_answer("A", not_, 0.2), _answer("A", not_, -0.3)) == "still not separable"
    assert outcome(_answer("A", sep, 2.0), {"verdict": "to come"}) == "to come"
    assert outcome(_answer("A", sep, 2.0), _answer("A", not_, 1.5) | {"partial": True}) == (
        "to come"
    )


def test_a_board_that_revisits_another_sets_its_answers_beside_the_earlier_ones(tmp_path):
    """A plan with `revisits: old`: the rendered questions end with the old board's answers
    (read from its committed board.json) beside this board's, an outcome and a count per
    partition; questions the old board never answered, or on partitions it lacked, are left
    out; an old board not rendered is an error naming the field."""
    from fedssl.reporting.board.revisit import revisited

    plan = questions.BoardQuestions.model_validate(PLAN | {"revisits": "old"})
    old = [_answer("A", "separable", 4.0), _answer("B", "separable", 1.0),
           _answer("C", "not separable", 0.1), _answer("A", "separable", 3.0, "Q")]  # fmt: skip
    with pytest.raises(ParamsError, match=r"q.yaml: board: revisits: .*old/board.json not found"):
        revisited([], plan, tmp_path, "q.yaml: board")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "board.json").write_text(json.dumps({"questions": old}))
    now = [_answer("A", "separable", 5.0) | {"n": [10, 10], "test": "paired t, df 9"},
           _answer("B", "not separable", 0.4), {**_answer("C", "to come", 0.0)}]  # fmt: skip
    del now[2]["difference"]
    text = revisited(now, plan, tmp_path, "q.yaml: board")
    assert "| twin | A | R | +4.0 [+3.0, +5.0] separable (n 3/3, pooled t, df 8) | " in text
    assert "+5.0 [+4.0, +6.0] separable (n 10/10, paired t, df 9) | holds |" in text
    assert "] not separable, MDE 2.0 (n 3/3, pooled t, df 8) | not confirmed |" in text
    assert "| to come | to come |" in text and "; Q*" not in text
    assert "- P: 2 separable before (1 holds, 1 not confirmed); 1 not separable before " in text
    assert revisited(now, questions.BoardQuestions.model_validate(PLAN), tmp_path, "") == ""
