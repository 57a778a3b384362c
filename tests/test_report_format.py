"""The report's building blocks (fedssl.reporting.formatting): the mean ± SD cell in both
conventions, checked against numbers worked out by hand, its caption, the number formatter,
the Markdown table and pivot, and figure saving that gives the same bytes twice."""

from __future__ import annotations

import pytest

from fedssl.reporting.formatting import (
    markdown_table,
    mean_sd,
    number,
    numbers,
    pivot_markdown,
    save_figure,
    sd_note,
    to_float,
)


def test_mean_sd_uses_the_convention_it_is_given():
    # 1, 2, 3, 4: mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5;
    # sample SD = sqrt(5 / 3) = 1.29099, population SD = sqrt(5 / 4) = 1.11803
    assert mean_sd([1, 2, 3, 4], "sample") == "2.50±1.29"
    assert mean_sd([1, 2, 3, 4], "population") == "2.50±1.12"
    assert mean_sd([1, 2, 3, 4], "sample", ".4f") == "2.5000±1.2910"
    assert mean_sd([1, 2, 3, 4], "population", ".1e") == "2.5e+00±1.1e+00"
    # one run shows its value, none a blank; missing values are left out
    assert mean_sd([7, None], "sample") == "7.00" and mean_sd([], "population") == ""
    with pytest.raises(ValueError, match="sd: expected one of sample, population"):
        mean_sd([1, 2], "std")


def test_the_caption_names_the_convention():
    assert sd_note("sample") == "mean ± sample SD over runs"
    assert sd_note("population", "trials") == "mean ± population SD over trials"
    with pytest.raises(ValueError, match="sd:"):
        sd_note("ddof1")


def test_numbers_read_blanks_flags_and_text():
    assert [to_float(v) for v in (None, "", "None", "n/a", "True", False, "2.5", 3)] == [
        None,
        None,
        None,
        None,
        1.0,
        0.0,
        2.5,
        3.0,
    ]
    assert numbers([{"a": "1"}, {"a": ""}, {}, {"a": 2}], "a") == [1.0, 2.0]
    assert number("1234.5") == "1.23e+03" and number(0.09, ".0%") == "9%"
    assert number(None) == "" and number("", "g", blank="–") == "–"


def test_a_markdown_table_has_its_caption_above_and_a_cell_per_header():
    assert markdown_table(["a", "b"], [["1", "2"]], "Caption") == (
        "*Caption*\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    )
    assert markdown_table(["a"], []) == "| a |\n|---|\n"
    with pytest.raises(ValueError, match="every line needs 2 cells"):
        markdown_table(["a", "b"], [["1"]])


def test_a_pivot_averages_the_runs_of_a_cell_and_states_its_sd():
    rows = [
        {"row": "A", "column": "x", "m": 84.0, "cost": "2.5e+11"},
        {"row": "A", "column": "x", "m": 85.0, "cost": "2.5e+11"},
        {"row": "A", "column": "y", "m": 85.3, "cost": ""},
        {"row": "B", "column": "y", "m": 81.9},
    ]
    table = pivot_markdown(rows, "m", "Top-1 %", "population", means={"cost": "cost"})
    lines = table.splitlines()
    assert lines[0] == "*Top-1 %; mean ± population SD over runs*"
    assert lines[2:] == [
        "| method | x | y | cost |",
        "|---|---|---|---|",
        "| A | 84.50±0.50 | 85.30 | 2.5e+11 |",
        "| B |  | 81.90 |  |",
    ]
    assert "84.50±0.71" in pivot_markdown(rows, "m", "Top-1 %")  # sample SD by default


def _figure(title: str):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 1.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot([0, 1, 2], [2, 0, 1], label="run")
    ax.set_title(title)
    ax.legend()
    return fig


def test_saved_figures_are_the_same_bytes_on_a_rerun(tmp_path):
    save_figure(_figure("a"), tmp_path / "one.png", dpi=50)
    save_figure(_figure("a"), tmp_path / "two.png", dpi=50)
    save_figure(_figure("b"), tmp_path / "other.png", dpi=50)
    one = (tmp_path / "one.png").read_bytes()
    assert one[:8] == b"\x89PNG\r\n\x1a\n" and one == (tmp_path / "two.png").read_bytes()
    assert one != (tmp_path / "other.png").read_bytes()
    assert b"Software" not in one and b"matplotlib" not in one.lower()  # no version stamp
    width, height = int.from_bytes(one[16:20], "big"), int.from_bytes(one[20:24], "big")
    assert (width, height) == (100, 75)  # figsize x the fixed dpi


def test_ranked_orders_highest_first_and_ties_share_a_rank():
    from fedssl.reporting.formatting import ranked

    cells = {"a": (70.0, "70"), "b": (73.84, "x"), "c": (73.84, "y"), "d": (10.0, "10")}
    assert ranked(cells) == {"a": "70 (3)", "b": "x (1)", "c": "y (1)", "d": "10 (4)"}
