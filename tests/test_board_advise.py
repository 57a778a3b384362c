"""`fedssl advise`: the board's lines that fit a client's budget on a partition, ranked, with
the differences from the top line the runs resolve."""

from __future__ import annotations

import json

import pytest

from fedssl.reporting.board import advise


def _line(method, values, mb, gflops=None, rounds=50, partition="F ξ=0.1"):
    return [
        {"experiment": f"{method}_s{s}", "row": method, "arch": "cnn", "column": partition}
        | {"linear_top1": v, "client_MB_exchanged": mb, "rounds": rounds}
        | ({} if gflops is None else {"client_GFLOPs": gflops})
        for s, v in enumerate(values)
    ]


ROWS = (
    _line("A", [80.0, 80.5, 81.0], mb=100, gflops=10)
    + _line("B", [77.0, 77.5, 78.0], mb=50, gflops=10)
    + _line("C", [76.0, 78.5, 77.0], mb=40, gflops=10)
    + _line("D", [90.0, 90.0, 90.0], mb=10)  # no FLOPs recorded: unknown, never fits a FLOPs cap
    + _line("R", [60.0, 60.5, 61.0], mb=0, rounds=0)
    + _line("A", [70.0], mb=100, partition="F 2 classes")
)


def test_the_lines_within_budget_ranked_with_what_is_resolved_from_the_top():
    """A 60 MB cap leaves A out: B tops, C is 0.3 under it and not resolved (with its MDE), the
    untrained reference R is 17 under and resolved; a FLOPs cap leaves out D, whose FLOPs are
    unknown, but not R, a reference that spends none."""
    got = advise.advise(ROWS, "0.1", advise.Budget(mb=60, gflops=20))["evaluations"]["ssl"]
    assert [x["method"] for x in got["lines"]] == ["B", "C", "R"]
    assert got["lines"][0]["ci95"] == pytest.approx([76.258, 78.742], abs=1e-3)
    c, r = got["against_top"]
    assert (
        c["line"] == "C"
        and not c["resolved"]
        and c["difference"] == pytest.approx(0.3333, abs=1e-3)
    )
    assert c["mde"] > abs(c["difference"])
    assert r["line"] == "R" and r["resolved"] and r["difference"] == pytest.approx(17.0)
    unbounded = advise.advise(ROWS, "F ξ=0.1", advise.Budget())["evaluations"]["ssl"]
    assert [x["method"] for x in unbounded["lines"]] == ["D", "A", "B", "C", "R"]
    text = advise.advise_text(advise.advise(ROWS, "0.1", advise.Budget(mb=60, gflops=20)))
    assert "| 1 | B | cnn | 3 | 77.5 | [76.3, 78.7] | top | 50 | 10 |  |" in text
    assert "| 3 | R (reference) | cnn | 3 | 60.5 |" in text and "−17.0, resolved" in text
    assert "Not resolved from the top line B: C." in text


def test_under_a_paired_board_the_top_is_compared_with_each_line_alone():
    """Under the third board's variance (paired) B vs C is the paired t over the seeds they
    share (scipy's ttest_rel, 2 df), not the model pooled with R's runs (6 df); the text
    names the test. The committed board2's plan says paired, and ``main`` passes it on."""
    from scipy import stats as sps

    got = advise.advise(ROWS, "0.1", advise.Budget(mb=60, gflops=20), "paired")
    c = got["evaluations"]["ssl"]["against_top"][0]
    paired = sps.ttest_rel([77.0, 77.5, 78.0], [76.0, 78.5, 77.0])
    # Holm's last step (R's p is ~0, C's the larger) multiplies C's p by 1
    assert c["line"] == "C" and c["p_adj"] == pytest.approx(paired.pvalue, abs=1e-5)
    pooled = advise.advise(ROWS, "0.1", advise.Budget(mb=60, gflops=20))
    assert pooled["evaluations"]["ssl"]["against_top"][0]["p_adj"] != pytest.approx(c["p_adj"])
    assert "vs top: paired t, Holm over the comparisons." in advise.advise_text(got)
    assert advise.load_questions("board2").variance == "paired"


def test_the_board_page_opens_with_the_advice_for_its_planned_budgets():
    """Two budgets on the two partitions with runs (the plan's third has none yet): with no
    limit D tops ξ = 0.1 and every line below it is resolved, a 60 MB / 20 GFLOPs cap gives B
    with C not resolved; an evaluation without a line on a partition has no row; a plan
    without budgets adds nothing."""
    from fedssl.reporting.board.questions import BoardQuestions

    family = {"says": "s", "evaluation": "ssl", "contrasts": [["B", "C"]]}
    plan = BoardQuestions.model_validate(
        {"partitions": ["F ξ=0.1", "F 2 classes", "F 100"], "families": {"f": family}}
        | {"variance": "paired"}
        | {"advice": [{"says": "no limit"}, {"says": "small", "mb": 60, "gflops": 20}]}
    )
    text = advise.planned_advice(ROWS, plan)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 4  # the header, then 2 budgets x 2 partitions, encoders only
    assert "| no limit | F ξ=0.1 | encoders | D 90.0 | [90.0, 90.0] | none | 5 |" in text
    assert "| small | F ξ=0.1 | encoders | B 77.5 | [76.3, 78.7] | C | 3 |" in text
    assert "| small | F 2 classes | encoders | no line fits |  |  | 0 |" in text
    assert "paired t, Holm over the fitting lines" in text
    assert advise.planned_advice(ROWS, plan.model_copy(update={"advice": []})) == ""
    assert "*The whole board: what `fedssl advise` answers for the planned" in text
    assert "*A partial board, 7 runs not made yet: what `fedssl advise`" in (
        advise.planned_advice(ROWS, plan, waiting=7)
    )


def test_a_partition_is_named_by_its_label_or_a_part_of_exactly_one():
    assert advise.advise(ROWS, "2 classes", advise.Budget())["partition"] == "F 2 classes"
    with pytest.raises(ValueError, match=r"--partition: 'F' names more than one partition"):
        advise.advise(ROWS, "F", advise.Budget())
    with pytest.raises(ValueError, match=r"--partition: 'IID' names no partition"):
        advise.advise(ROWS, "IID", advise.Budget())
    nothing = advise.advise(ROWS, "2 classes", advise.Budget(mb=1))
    assert "No line of the board fits" in advise.advise_text(nothing)


def test_fedssl_advise_reads_the_committed_board(capsys):
    """On the committed board, 2 classes/client, 200 GFLOPs a client: the personalised lines
    within it (182 GFLOPs; FedRep's 835 left out), each compared with the top; an unknown
    partition is an error naming the flag."""
    from fedssl import cli

    assert cli.TOOLS["advise"][0] == "fedssl.reporting.board.advise"
    assert advise.main(["--partition", "2 classes", "--client-gflops", "200", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    personal = got["evaluations"]["personal"]
    assert all(x["client_GFLOPs"] <= 200 for x in personal["lines"] if "client_GFLOPs" in x)
    assert "FedRep" not in [x["method"] for x in personal["lines"]]  # 835 GFLOPs
    assert len(personal["against_top"]) == len(personal["lines"]) - 1
    assert advise.main(["--partition", "ξ=0.5"]) == 1
    assert "--partition: 'ξ=0.5' names no partition" in capsys.readouterr().err
