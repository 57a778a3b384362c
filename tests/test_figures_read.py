"""Curves that read true: a run of one round is a marker over its line's name (not a lone dot
on a scale of its own), a round that computes no loss is not drawn as a loss of 0, and the
caption says how many seeds a line has (a one-seed figure said "median over seeds")."""

from __future__ import annotations

from fedssl.reporting import figures
from fedssl.reporting.report import _curve


def test_a_one_round_panel_puts_each_lines_runs_over_its_name():
    plt = figures._pyplot()
    fig, ax = plt.subplots()
    lines = {"IID": [([1.0], [0.60]), ([1.0], [0.62]), ([1.0], [0.66])], "ξ=0.1": [([1.0], [0.64])]}
    colours = figures.colours_for(plt, list(lines))
    figures._curve_panel(
        ax, "MFCL(TN)", lines, colours, [], is_loss=True, log=False, marks=[],
        xlabel="round", ylabel="training loss", title_chars=30,
    )  # fmt: skip
    assert [t.get_text() for t in ax.get_xticklabels()] == ["IID", "ξ=0.1"]
    drawn = [(list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()]
    assert drawn == [([0, 0, 0], [0.60, 0.62, 0.66]), ([1], [0.64])]
    assert [t.get_text() for t in ax.texts] == ["0.62", "0.64"]  # each line's median
    assert ax.get_xlabel() == "round 1, the only one logged"
    plt.close(fig)


def test_a_round_without_a_loss_is_not_drawn_as_zero():
    rows = [{"round": "1", "loss": "0.0", "acc": "0.0"}, {"round": "2", "loss": "4.94", "acc": "9"}]
    assert _curve(rows, "loss") == ([2.0], [4.94])  # Orchestra's clustering round logs 0.0
    assert _curve(rows, "acc") == ([1.0, 2.0], [0.0, 9.0])  # an accuracy of 0 is one


def test_the_caption_says_how_many_seeds_a_line_has():
    assert figures.seeds_caption([1, 1, 1]) == "one run per line"
    band = "a line (its seeds or swept settings), band = min to max"
    assert figures.seeds_caption([3, 3]) == f"median over 3 runs {band}"
    assert figures.seeds_caption([1, 3, 2]) == f"median over 1-3 runs {band}"


def test_a_crowded_panel_of_the_run_splits_into_rows_of_few_lines():
    """Fifteen personalised methods' curves in one panel took shades of one colour: a row of
    the accuracy over the run holds at most six, in rows of about equal size, the highest
    lines first (here m13 reads highest: it leads the first row)."""
    from fedssl.reporting.board.figures import _over_run_rows

    cells = [
        {
            "partition": "P",
            "evaluation": "personal",
            "encoder": "cnn",
            "method": f"m{13 - i:02}",
            "values": {"personal_last": [60.0 - i]},
        }
        for i in range(14)
    ]
    cells.reverse()  # listed lowest first: the rows follow the accuracy, not the order
    row_of = _over_run_rows(cells)
    rows = [row_of(c) for c in reversed(cells)]  # highest first
    assert rows == [f"P · personalised · lines {i // 5 + 1} of 3" for i in range(14)]
    assert _over_run_rows(cells[:6])(cells[0]) == "P · personalised"  # six fit one row
