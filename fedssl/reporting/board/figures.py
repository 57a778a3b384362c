"""The board's figures: accuracy against a client cost (small multiples, the Pareto front named)
and the accuracy over the run per family of lines."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from fedssl.evaluations.costs import CLIENT_GFLOPS, CLIENT_MB_EXCHANGED
from fedssl.reporting.board.cells import EVALUATIONS, accuracy_of, is_reference, run_curves
from fedssl.reporting.formatting import save_figure

MARKER_PT = 4  # a cost figure's point, points across


def family_of(cell: dict) -> str:
    """A line's family in the board's figures: ``personalised`` or ``encoders``."""
    return "personalised" if cell["evaluation"] == "personal" else "encoders"


def panel_of(cell: dict) -> str:
    """A line's panel in the board's figures: its partition and family."""
    return f"{cell['partition']} · {family_of(cell)}"


def _reference_label(cell: dict) -> str:
    """A reference's level label: an untrained network by its name; a personalised
    reference (SOLO: each client alone) by its own."""
    return cell["method"] if cell["evaluation"] == "personal" else f"untrained {cell['encoder']}"


def _panels(cell_list: list[dict], cost: str) -> tuple[dict, dict]:
    """Per panel (:func:`panel_of`), its points (``x`` the mean cost, ``y`` the mean accuracy,
    ``err`` its SD, ``label``, ``group`` the encoder, ``reference``) and its y label; a line
    that costs nothing has ``x`` None."""
    panels, ylabels = {}, {}
    for cell in cell_list:
        accuracy = accuracy_of(cell)
        if not accuracy:
            continue
        name = panel_of(cell)
        ys, xs = cell["values"][accuracy], cell["values"].get(cost)
        ylabels[name] = f"{EVALUATIONS[cell['evaluation']][1][accuracy]} top-1 %"
        x = statistics.mean(xs) if xs and statistics.mean(xs) > 0 else None
        reference = is_reference(cell) or x is None
        panels.setdefault(name, []).append(
            {"x": x, "y": statistics.mean(ys), "err": statistics.stdev(ys) if len(ys) > 1 else 0.0}
            | {"group": cell["encoder"], "reference": reference}
            | {"label": _reference_label(cell) if reference else cell["method"]}
        )
    return panels, ylabels


def front_of(points: list[dict]) -> list[int]:
    """The methods on the Pareto front: those no other line beats in cost and accuracy, a
    reference included (one that costs nothing sits at cost 0), the references never on it."""
    from fedssl.reporting.figures import pareto_front

    pairs = [(p["x"] or 0.0, p["y"]) for p in points]
    return [i for i in pareto_front(pairs) if not points[i]["reference"]]


def plot(cell_list: list[dict], cost: str, label: str, path: Path) -> None:
    """Accuracy against a cost (:func:`draw`), saved at ``path``."""
    fig = draw(cell_list, cost, label)
    save_figure(fig, path, dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)


def draw(cell_list: list[dict], cost: str, label: str):
    """Accuracy (the line's :func:`accuracy_of`) against a cost, one panel per evaluation and
    partition: a point per line with its SD over seeds, the cost axis log-scaled, the Pareto
    front of the methods drawn and named; the references as hollow diamonds, those that cost
    nothing (or under a fifth of the cheapest method's) on the panel's left edge with their
    name, never on the front but beating the methods below them off it; the other lines
    numbered, their names in the key; no label over another (:func:`place_labels`)."""
    from fedssl.reporting.figures import _pyplot, colours_for, grid_shape, log_axis

    panels, ylabels = _panels(cell_list, cost)
    unit = label.split(" /")[0]
    for points in panels.values():
        _to_edge(points, unit)
    names = sorted(panels, key=lambda n: (n.endswith("personalised"), list(panels).index(n)))
    plt = _pyplot()
    rows, cols = grid_shape(len(names), 3)
    fig, axes = plt.subplots(rows, cols, figsize=(5.4 * cols, 4.6 * rows), squeeze=False)
    colours = colours_for(plt, list(dict.fromkeys(p["group"] for n in names for p in panels[n])))
    numbered: dict[str, int] = {}
    drawn = []
    for ax, name in zip(axes.flat, names):
        log_axis(ax)
        drawn.append((ax, _cost_panel(ax, panels[name], colours, numbered)))
        ax.set_title(name, fontsize=9, pad=14)  # room for a label pushed above the panel
        ax.set_xlabel(label, fontsize=8)
        ax.set_ylabel(ylabels[name], fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, which="both")
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    bottom = _cost_key(plt, fig, colours, numbered)
    fig.tight_layout(rect=(0.02, bottom, 0.98, 1))
    for ax, labels in drawn:  # on the final layout: the labels are placed in display space
        place_labels(ax, labels)
    return fig


def _to_edge(points: list[dict], unit: str) -> None:
    """References that cost nothing, or under a fifth of the cheapest method's cost (MFCL's
    stem at init: ~9 GFLOPs against hundreds), go to the panel's left edge (``x`` None), the
    cost they have in their label."""
    points.extend(_far_below(points, unit))


def _cost_panel(ax, points: list[dict], colours: dict, numbered: dict[str, int]) -> list:
    """One panel's points, its front as a step line; returns the labels to place, each
    ``(text, anchor in data or axes-edge coordinates, transform)``."""
    front = front_of(points)
    edge = ax.get_yaxis_transform()  # x in axes fraction, y in data: the left edge
    labels = []
    for i, p in enumerate(points):
        colour = colours[p["group"]]
        marker, face = ("D", "white") if p["reference"] else ("o", colour)
        at, transform = ((0.0, p["y"]), edge) if p["x"] is None else ((p["x"], p["y"]), None)
        ax.errorbar(*at, yerr=p["err"] or None, marker=marker, ms=MARKER_PT, capsize=2, ls="none",
                    color=colour, mfc=face, clip_on=False,
                    transform=transform or ax.transData)  # fmt: skip
        named = i in front or p["reference"]
        text = p["label"] if named else str(numbered.setdefault(p["label"], len(numbered) + 1))
        labels.append((text, at, transform))
    if front:
        xs, ys = [points[i]["x"] for i in front], [points[i]["y"] for i in front]
        ax.step(xs, ys, where="post", color="k", lw=0.8, alpha=0.6)
    return labels


def _cost_key(plt, fig, colours: dict, numbered: dict[str, int]) -> float:
    """The key under the panels: a colour per encoder, the front, the references' mark, and
    the numbered lines' names, stacked in a footer the figure grows by (the legend's rows,
    then the names' lines); returns the footer's height as a fraction of the figure."""
    from fedssl.reporting.figures import numbered_key

    handles = [plt.Line2D([], [], marker="o", ls="none", color=c, label=g)
               for g, c in colours.items()]  # fmt: skip
    handles.append(plt.Line2D([], [], color="k", lw=0.8, label="Pareto front (named)"))
    handles.append(plt.Line2D([], [], marker="D", ls="none", color="0.4", mfc="white",
                              label="reference (left edge: costs nothing)"))  # fmt: skip
    ncol = min(6, len(handles))
    width, height = fig.get_size_inches()
    lines = numbered_key(numbered, int(width * 72 / KEY_CHAR_PT))  # as wide as the figure
    rows = -(-len(handles) // ncol)
    footer = LEGEND_ROW_IN * rows + KEY_LINE_IN * len(lines) + 0.1  # inches
    fig.set_size_inches(width, height + footer)
    bottom = footer / (height + footer)
    fig.legend(handles=handles, loc="upper center", ncol=ncol, fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, bottom), borderaxespad=0.0)  # fmt: skip
    if lines:
        fig.text(0.01, 0.04 / (height + footer), "\n".join(lines), fontsize=6, va="bottom",
                 linespacing=1.2)  # fmt: skip
    return bottom


# The key's measures at its font sizes (7 pt legend, 6 pt names): a legend row's height and a
# name line's, in inches, and a 6 pt character's mean width in points, for the wrap.
LEGEND_ROW_IN, KEY_LINE_IN, KEY_CHAR_PT = 0.22, 0.12, 3.4


LABEL_GAP_PX = 1.0


def place_labels(ax, labels: list[tuple], fontsize: int = 6) -> list:
    """Each label beside its point, moved up (or, under the panel's title, down) until its
    box is clear by a few pixels of every label placed before it and of the other points'
    markers, and to the point's left where it would leave the figure; returns the drawn
    texts."""
    renderer = ax.figure.canvas.get_renderer()
    title = ax.title.get_window_extent(renderer)
    room = (ax.figure.bbox.x1, min(ax.figure.bbox.y1, title.y0), ax.figure.bbox.y0)
    markers = [marker_box(ax, _anchor_px(ax, label)) for label in labels]
    placed, texts = [title], []
    for i in sorted(range(len(labels)), key=lambda i: markers[i].y0):
        text, at, transform = labels[i]
        t = ax.annotate(
            text, at, xycoords=transform or "data", xytext=(3, 2), textcoords="offset points",
            fontsize=fontsize, annotation_clip=False,
            arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.4, "shrinkA": 0, "shrinkB": 2},
        )  # fmt: skip
        if _box(t, renderer).x1 > room[0]:
            t.set_horizontalalignment("right")
            t.xyann = (-3, 2)
        _clear(t, placed + markers[:i] + markers[i + 1 :], renderer, room[1:])
        placed.append(_box(t, renderer))
        texts.append(t)
    return texts


LABEL_GAP_PX = (4.0, 1.0)  # the clearance kept between two labels' boxes: across, up


def _clear(t, placed: list, renderer, room: tuple[float, float], tries: int = 400) -> None:
    """Moves ``t`` up past every placed box it comes near, down from its start where up would
    cross ``room``'s ceiling (its floor is the figure's bottom)."""
    start, step = t.xyann, +1
    per_px = 72 / t.figure.dpi
    ceiling, floor = room
    for _ in range(tries):
        box = _box(t, renderer)
        hit = next((b for b in placed if _near(box, b)), None)
        if box.y1 > ceiling and step > 0:  # up is out: start again, downwards
            t.xyann, step = start, -1
            continue
        if hit is None or box.y0 < floor:
            return
        gap = LABEL_GAP_PX[1]
        dy = hit.y1 - box.y0 + gap if step > 0 else hit.y0 - box.y1 - gap
        t.xyann = (t.xyann[0], t.xyann[1] + dy * per_px)


def _near(a, b) -> bool:
    """Two boxes closer than :data:`LABEL_GAP_PX` (across) or overlapping (up)."""
    gap = LABEL_GAP_PX[0]
    return a.x0 - gap < b.x1 and b.x0 - gap < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _box(t, renderer):
    """A label's text box alone (an annotation's own extent spans its leader line too)."""
    from matplotlib.text import Text

    t.update_positions(renderer)  # where its offset puts it now
    return Text.get_window_extent(t, renderer)


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def marker_box(ax, at_px: tuple[float, float]):
    """The display box of a point's marker centred at ``at_px``."""
    from matplotlib.transforms import Bbox

    half = MARKER_PT / 2 * ax.figure.dpi / 72
    x, y = at_px
    return Bbox.from_extents(x - half, y - half, x + half, y + half)


def _anchor_px(ax, label: tuple) -> tuple[float, float]:
    _, at, transform = label
    return (transform or ax.transData).transform(at)


def label_boxes(fig) -> list[list]:
    """Per panel of a drawn figure, the display boxes of its title and point labels (its
    annotations), the title first."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [
        [ax.title.get_window_extent(renderer)] + [_box(t, renderer) for t in ax.texts]
        for ax in fig.axes
        if ax.texts
    ]


def _far_below(points: list[dict], unit: str, factor: float = 5.0) -> list[dict]:
    """Takes out of ``points`` the references that cost under a ``factor``-th of the panel's
    cheapest method and returns them for the panel's edge (``x`` None) with their cost in the
    label (MFCL's untrained stem exports its representations in ~10 GFLOPs against the
    methods' 500-2,000: as a point it would stretch the log axis over decades where no
    method is)."""
    cheapest = min((p["x"] for p in points if not p["reference"]), default=None)
    far = [
        p
        for p in points
        if p["reference"] and p["x"] is not None and cheapest and p["x"] * factor < cheapest
    ]
    points[:] = [p for p in points if p not in far]
    return [p | {"label": f"{p['label']} ({p['x']:.3g} {unit})", "x": None} for p in far]


# run_curves' fields the accuracy over the run is drawn against: field -> (axis, panel word)
def _distinct_levels(marks: list[tuple[str, str, float]]) -> list[tuple[str, float]]:
    """One labelled level per target value of a panel's ``(line, evaluation, target)``:
    what the target is, and, where the panel has several, whose it is."""
    by_value: dict[float, list[tuple[str, str]]] = {}
    for line, evaluation, y in marks:
        by_value.setdefault(round(y, 2), []).append((line, evaluation))
    levels = []
    for y, lines in by_value.items():
        what = "SOLO's accuracy" if lines[0][1] == "personal" else "untrained + 3"
        names = [n.split(" (")[0] for n, _ in lines]  # "FedProx (μ=0.01)" -> "FedProx"
        whose = ", ".join(names) if len(names) <= 3 else f"{len(names)} lines"
        levels.append((f"target: {what}" + (f" ({whose})" if len(by_value) > 1 else ""), y))
    return levels


# A point's field -> (its axis label, the panel's word): its round, the run's wall minutes,
# the client's MB and GFLOPs by that round (the declared costs' labels, on log scales).
COST_AXES = (CLIENT_MB_EXCHANGED.label, CLIENT_GFLOPS.label)
OVER_RUN_LINES = 6  # the most lines a panel of the accuracy over the run draws
# The share of each run's last points that sets a panel's y-axis: nine personalised lines
# ending within 89-96 % were one band on the 0-100 % their first rounds span.
OVER_RUN_ZOOM = 0.5


OVER_RUN_AXES = {
    0: ("round", "rounds"),
    4: ("wall minutes", "wall time"),
    2: (COST_AXES[0], "MB"),
    3: (COST_AXES[1], "FLOPs"),
}


def _over_run_rows(cells_: list[dict], families: dict | None = None):
    """A line's row in the accuracy-over-the-run figure: its partition and the planned
    question family that asks about it (``families``: :func:`.questions.line_families`), or
    for a line no family asks about its panel, split by encoder where the panel's curves come
    from several (a ViT's curve among fifteen small CNNs' is unreadable, and families are
    compared on their own rounds); then into rows of at most :data:`OVER_RUN_LINES` lines,
    the highest lines (by the board's accuracy) first, so lines that end close together
    share a panel and its zoomed axis."""
    encoders: dict[str, set[str]] = {}
    for cell in cells_:
        encoders.setdefault(panel_of(cell), set()).add(cell["encoder"])

    def base_row(cell: dict) -> str:
        where = panel_of(cell)
        asked = (families or {}).get((cell["evaluation"], cell["partition"], cell["method"]))
        if asked:
            return f"{cell['partition']} · {asked}"
        return f"{where} · {cell['encoder']}" if len(encoders[where]) > 1 else where

    lines: dict[str, list[str]] = {}
    for cell in sorted(cells_, key=lambda c: -_level(c)):
        methods = lines.setdefault(base_row(cell), [])
        methods += [] if cell["method"] in methods else [cell["method"]]

    def row_of(cell: dict) -> str:
        methods = lines[base_row(cell)]
        parts = math.ceil(len(methods) / OVER_RUN_LINES)
        size = math.ceil(len(methods) / parts)  # parts of about equal size
        part = methods.index(cell["method"]) // size
        return base_row(cell) + (f" · lines {part + 1} of {parts}" if parts > 1 else "")

    return row_of


def _level(cell: dict) -> float:
    """A line's mean accuracy (the board's column), 0 where it has none."""
    accuracy = accuracy_of(cell)
    return statistics.mean(cell["values"][accuracy]) if accuracy else 0.0


def over_run_file(family: str) -> str:
    """The accuracy-over-the-run figure of a family (``encoders``, ``personalised``): a file
    each, so each has its own colours and a key of its own lines."""
    return f"board_over_run_{family}.png"


def plot_over_run(
    cell_list: list[dict],
    logs: dict[str, list[dict]],
    folder: Path,
    families: dict | None = None,
) -> list[str]:
    """Accuracy over the run (median over seeds) against rounds, wall time, MB and GFLOPs, a
    figure per family (:func:`over_run_file`) with a row of panels per partition and planned
    question family (``families``, :func:`_over_run_rows`) whose runs log accuracy per round
    (a line per method), each panel's y-axis zoomed to where its runs end
    (:data:`OVER_RUN_ZOOM`), lines that share a panel in hues apart; returns the files
    drawn."""
    drawn = [
        (cell, curves) for cell in cell_list if (curves := [c for c in run_curves(cell, logs) if c])
    ]
    by_figure: dict[str, list] = {}
    for cell, curves in drawn:
        by_figure.setdefault(family_of(cell), []).append((cell, curves))
    files = []
    for family, members in by_figure.items():
        row_of = _over_run_rows([cell for cell, _ in members], families)
        if _plot_family_over_run(members, folder / over_run_file(family), family, row_of):
            files.append(over_run_file(family))
    return files


def _rows_together(drawn: list[tuple[dict, list]], row_of) -> list[tuple[dict, list]]:
    """The drawn lines with each row's together: a panel's families in the board's order,
    and a family's "lines 1 of n" before its "lines 2 of n" whichever line (a reference) the
    board listed first."""
    panels = list(dict.fromkeys(panel_of(cell) for cell, _ in drawn))
    families = list(dict.fromkeys(row_of(c).split(" · lines ")[0] for c, _ in drawn))
    return sorted(
        drawn,
        key=lambda d: (
            panels.index(panel_of(d[0])),
            families.index(row_of(d[0]).split(" · lines ")[0]),
            row_of(d[0]),
        ),
    )


def _plot_family_over_run(drawn: list[tuple[dict, list]], path: Path, family: str, row_of) -> bool:
    from fedssl.reporting.figures import CurveLook, _pyplot, colours_apart, learning_curves

    rows: dict[str, dict[int, dict]] = {}  # row -> field -> method -> runs
    marks: dict[str, list[tuple[str, str, float]]] = {}  # row -> its lines' targets
    drawn = _rows_together(drawn, row_of)
    for cell, curves in drawn:
        target = (cell.get("to_target") or {}).get("target")
        if target is not None:
            mark = (cell["method"], cell["evaluation"], target)
            marks.setdefault(row_of(cell), []).append(mark)
        for j in OVER_RUN_AXES:
            runs = [([p[j] for p in c], [p[1] for p in c]) for c in curves]
            if all(x is not None for xs, _ in runs for x in xs):
                rows.setdefault(row_of(cell), {}).setdefault(j, {})[cell["method"]] = runs
    panels, xlabels, levels = {}, {}, {}
    for where, fields in rows.items():
        for j, (axis, word) in OVER_RUN_AXES.items():
            if j in fields:
                name = f"{where}\nagainst {word}"  # two lines: a row's name fills a panel
                panels[name], xlabels[name] = fields[j], axis
                levels[name] = _distinct_levels(marks.get(where, []))
    if not panels:
        return False
    metric = "the clients' mean" if family == "personalised" else "k-NN monitor"
    learning_curves(
        panels,
        {n: "accuracy, top-1 %" for n in panels},
        path,
        xlabel=xlabels,
        columns=len(OVER_RUN_AXES),
        log_x=[n for n, axis in xlabels.items() if axis in COST_AXES],
        title=f"Accuracy over the run, {family} ({metric}), a row per partition and planned "
        f"question family, each axis zoomed to the runs' last {OVER_RUN_ZOOM:.0%}; dotted: "
        "the targets",
        levels=levels,
        look=CurveLook(
            colours_apart(_pyplot(), [list(lines) for lines in panels.values()]),
            OVER_RUN_ZOOM,
            tuple(f"{where}\nagainst {OVER_RUN_AXES[0][1]}" for where in rows),
        ),
    )
    return True
