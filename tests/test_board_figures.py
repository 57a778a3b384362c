"""The board's accuracy-against-cost figures: references as points off the front that still
beat the methods below them, and labels that do not collide (their drawn boxes measured)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from fedssl.reporting import board
from fedssl.reporting.board import figures


def _point(label, x, y, reference=False):
    return {"label": label, "x": x, "y": y, "err": 0.0, "group": "g", "reference": reference}


def test_references_are_never_on_the_front_and_beat_what_is_below_them():
    """The untrained network costs nothing (x None) at 75: A (70, cheap) is off the front it
    would have led; B (80) and D (85) are on it; C (78, dearer than B) is not; a hollow
    reference at 5 MB and 82 takes B off the front too."""
    points = [
        _point("untrained", None, 75.0, reference=True),
        _point("A", 10.0, 70.0),
        _point("B", 20.0, 80.0),
        _point("C", 30.0, 78.0),
        _point("D", 40.0, 85.0),
    ]
    assert figures.front_of(points) == [2, 4]
    assert figures.front_of(points + [_point("stem", 5.0, 82.0, reference=True)]) == [4]


def _overlaps(fig) -> list[tuple]:
    """Pairs of a panel's boxes (title and labels) that overlap, and boxes off the figure."""
    page, bad = fig.bbox, []
    for boxes in figures.label_boxes(fig):
        bad += [(a, b) for a, b in itertools.combinations(boxes, 2) if figures._overlap(a, b)]
        bad += [(b,) for b in boxes if b.x0 < page.x0 or b.x1 > page.x1 or b.y1 > page.y1]
    return bad


def _crowd():
    """Twelve lines within half a point and a few MB of each other, two references."""
    rows = []
    for i in range(12):
        method = f"a long method name {i}" if i % 3 == 0 else f"M{i}"
        for s in range(2):
            rows.append(
                {"experiment": f"{method}_s{s}", "row": method, "arch": "cnn", "column": "P"}
                | {"linear_top1": 70.0 + 0.04 * i + 0.1 * s, "client_MB_exchanged": 30 + i % 4}
            )
    for name, mb in (("untrained", 0.0), ("stem at init", 29.0)):
        rows += [
            {"experiment": f"{name}_s{s}", "row": name, "arch": "cnn", "column": "P"}
            | {"linear_top1": 70.2, "client_MB_exchanged": mb, "rounds": 0}
            for s in range(2)
        ]
    return board.cells.cells(rows, {})


def test_crowded_labels_are_drawn_apart():
    fig = figures.draw(_crowd(), "client_MB_exchanged", "MB / client")
    assert sum(len(b) for b in figures.label_boxes(fig)) == 1 + 14  # the title and 14 labels
    assert _overlaps(fig) == []
    # the same labels without placing them (each at its point) would collide
    ax = next(a for a in fig.axes if a.texts)
    for t in ax.texts:
        t.xyann = (3, 2)
    assert _overlaps(fig) != []


def _on_markers(fig, marker_box=figures.marker_box) -> list[tuple]:
    """Labels whose box overlaps another point's marker (its own point's is where it starts)."""
    fig.canvas.draw()
    renderer, bad = fig.canvas.get_renderer(), []
    for ax in fig.axes:
        points = [
            tuple(ax.transData.transform(xy))
            for line in ax.lines
            if line.get_marker() in ("o", "D")  # the points, not their error bars' caps
            for xy in line.get_xydata()
        ]
        for t in ax.texts:
            own = t.get_transform().transform(t.xy)
            box = figures._box(t, renderer)
            bad += [
                (t.get_text(), p)
                for p in points
                if abs(p[0] - own[0]) + abs(p[1] - own[1]) > 0.5
                and figures._overlap(box, marker_box(ax, p))
            ]
    return bad


def test_labels_keep_off_the_other_points_markers(monkeypatch):
    """Five lines within a third of a point and 3 MB of each other on an axis from 2 to 46
    MB (the personalised panel's crowd): no label sits on another line's marker; placed
    clear of the other labels alone (markers out of the rule), some do."""
    rows = []
    for name, i in [*((f"line {i}", i) for i in range(5)), ("far", 40), ("low", -60)]:
        rows += [
            {"experiment": f"{name}_s{s}", "row": name, "arch": "cnn", "column": "P"}
            | {"linear_top1": 94.0 + 0.08 * i + 0.01 * s, "client_MB_exchanged": 18 + 0.7 * i}
            for s in range(2)
        ]
    rows = [r | {"client_MB_exchanged": max(r["client_MB_exchanged"], 2.0)} for r in rows]
    cells = board.cells.cells(rows, {})
    fig = figures.draw(cells, "client_MB_exchanged", "MB / client")
    assert _on_markers(fig) == [] and _overlaps(fig) == []
    real = figures.marker_box
    monkeypatch.setattr(figures, "marker_box", lambda ax, at: real(ax, (-1e6, -1e6)))
    unaware = figures.draw(cells, "client_MB_exchanged", "MB / client")
    assert len(_on_markers(unaware, real)) >= 2


def test_the_committed_boards_figures_have_no_colliding_label():
    rows = json.loads(Path("results/reports/board/report.json").read_text())["rows"]
    cells = board.cells.cells(rows, {})
    for cost in ("client_MB_exchanged", "total_GFLOPs"):
        fig = figures.draw(cells, cost, cost)
        assert _overlaps(fig) == [], cost


def test_the_key_under_the_panels_clears_the_panels_and_the_legend():
    """Thirty lines off the front: their names wrap over several lines, which sit under the
    legend, the legend under the panels' axis labels, and every line of it inside the page;
    a figure with more names grows taller instead of squeezing them into the legend."""
    rows = []
    for i in range(30):
        method = f"method number {i} with a long name"
        rows += [
            {"experiment": f"m{i}_s{s}", "row": method, "arch": f"enc{i % 7}", "column": "P"}
            | {"linear_top1": 70.0 - 0.3 * i + 0.1 * s, "client_MB_exchanged": 30 + 5 * i}
            for s in range(2)
        ]
    cells = board.cells.cells(rows, {})
    fig = figures.draw(cells, "client_MB_exchanged", "MB / client")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (key,) = fig.texts
    key_box = key.get_window_extent(renderer)
    legend_box = fig.legends[0].get_window_extent(renderer)
    axes_bottom = min(ax.get_tightbbox(renderer).y0 for ax in fig.axes if ax.get_visible())
    assert key.get_text().count("\n") >= 2
    assert key_box.y1 < legend_box.y0 and legend_box.y1 < axes_bottom
    assert key_box.y0 >= fig.bbox.y0 and key_box.x1 <= fig.bbox.x1
    few = figures.draw(board.cells.cells(rows[:4], {}), "client_MB_exchanged", "MB / client")
    assert fig.get_size_inches()[1] > few.get_size_inches()[1]
