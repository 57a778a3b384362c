"""The board's figures: accuracy against a client cost (small multiples, the Pareto front named)
and the accuracy over the run per family of lines."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from fedssl.evaluations.costs import CLIENT_GFLOPS, CLIENT_MB_EXCHANGED
from fedssl.reporting.board.cells import EVALUATIONS, accuracy_of, is_reference, run_curves


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


def plot(cell_list: list[dict], cost: str, label: str, path: Path) -> None:
    """Accuracy (the line's :func:`accuracy_of`) against a cost, one panel per evaluation and
    partition: a point per line with its SD over seeds, the Pareto front labelled, the lines
    that exchange nothing (or cost nothing) as dotted levels, a reference that does cost
    something (MFCL's untrained stem uploads its representations) as a hollow point
    (:func:`fedssl.reporting.figures.accuracy_vs_cost`)."""
    from fedssl.reporting.figures import accuracy_vs_cost

    panels, references, ylabels = {}, {}, {}
    for cell in cell_list:
        accuracy = accuracy_of(cell)
        if not accuracy:
            continue
        name = panel_of(cell)
        ys, xs = cell["values"][accuracy], cell["values"].get(cost)
        ylabels[name] = f"{EVALUATIONS[cell['evaluation']][1][accuracy]} top-1 %"
        y = statistics.mean(ys)
        if not xs or statistics.mean(xs) <= 0:
            references.setdefault(name, []).append({"label": _reference_label(cell), "y": y})
            panels.setdefault(name, [])
            continue
        panels.setdefault(name, []).append(
            {
                "x": statistics.mean(xs),
                "y": y,
                "err": statistics.stdev(ys) if len(ys) > 1 else 0.0,
                "label": cell["method"],
                "group": cell["encoder"],
                "reference": is_reference(cell),  # drawn hollow, never on the front
            }
        )
    for name, points in panels.items():
        references.setdefault(name, []).extend(_far_below(points, label.split(" /")[0]))
    order = sorted(panels, key=lambda n: (n.endswith("personalised"), list(panels).index(n)))
    accuracy_vs_cost(
        {n: panels[n] for n in order},
        label,
        ylabels,
        path,
        references=references,
    )


def _far_below(points: list[dict], unit: str, factor: float = 5.0) -> list[dict]:
    """Takes out of ``points`` the references that cost under a ``factor``-th of the panel's
    cheapest method and returns them as levels with their cost in the label (MFCL's untrained
    stem exports its representations in ~10 GFLOPs against the methods' 500-2,000: as a point
    it would stretch the log axis over decades where no method is)."""
    cheapest = min((p["x"] for p in points if not p["reference"]), default=None)
    far = [p for p in points if p["reference"] and cheapest and p["x"] * factor < cheapest]
    points[:] = [p for p in points if p not in far]
    return [{"label": f"{p['label']}\n({p['x']:.3g} {unit})", "y": p["y"]} for p in far]


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


OVER_RUN_AXES = {
    0: ("round", "rounds"),
    4: ("wall minutes", "wall time"),
    2: (COST_AXES[0], "MB"),
    3: (COST_AXES[1], "FLOPs"),
}


def _over_run_rows(cells_: list[dict]):
    """A line's row in the accuracy-over-the-run figure: its panel, split by encoder where
    the panel's curves come from several (a ViT's curve among fifteen small CNNs' is
    unreadable, and families are compared on their own rounds), then into rows of at most
    :data:`OVER_RUN_LINES` lines, each of its own hues (fifteen methods' curves in one panel
    took shades of one colour)."""
    encoders: dict[str, set[str]] = {}
    for cell in cells_:
        encoders.setdefault(panel_of(cell), set()).add(cell["encoder"])

    def base_row(cell: dict) -> str:
        where = panel_of(cell)
        return f"{where} · {cell['encoder']}" if len(encoders[where]) > 1 else where

    lines: dict[str, list[str]] = {}
    for cell in cells_:
        methods = lines.setdefault(base_row(cell), [])
        methods += [] if cell["method"] in methods else [cell["method"]]

    def row_of(cell: dict) -> str:
        methods = lines[base_row(cell)]
        parts = math.ceil(len(methods) / OVER_RUN_LINES)
        size = math.ceil(len(methods) / parts)  # parts of about equal size
        part = methods.index(cell["method"]) // size
        return base_row(cell) + (f" · lines {part + 1} of {parts}" if parts > 1 else "")

    return row_of


def over_run_file(family: str) -> str:
    """The accuracy-over-the-run figure of a family (``encoders``, ``personalised``): a file
    each, so each has its own colours and a key of its own lines."""
    return f"board_over_run_{family}.png"


def plot_over_run(cell_list: list[dict], logs: dict[str, list[dict]], folder: Path) -> list[str]:
    """Accuracy over the run (median over seeds) against rounds, wall time, MB and GFLOPs, a
    figure per family (:func:`over_run_file`) with a row of panels per partition whose runs
    log accuracy per round (a line per method); returns the files drawn."""
    drawn = [
        (cell, curves) for cell in cell_list if (curves := [c for c in run_curves(cell, logs) if c])
    ]
    families: dict[str, list] = {}
    for cell, curves in drawn:
        families.setdefault(family_of(cell), []).append((cell, curves))
    files = []
    for family, members in families.items():
        if _plot_family_over_run(members, folder / over_run_file(family), family):
            files.append(over_run_file(family))
    return files


def _plot_family_over_run(drawn: list[tuple[dict, list]], path: Path, family: str) -> bool:
    from fedssl.reporting.figures import learning_curves

    rows: dict[str, dict[int, dict]] = {}  # row -> field -> method -> runs
    marks: dict[str, list[tuple[str, str, float]]] = {}  # row -> its lines' targets
    panels_in_order = list(dict.fromkeys(panel_of(cell) for cell, _ in drawn))
    drawn = sorted(drawn, key=lambda d: panels_in_order.index(panel_of(d[0])))  # rows together
    row_of = _over_run_rows([cell for cell, _ in drawn])
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
        title=f"Accuracy over the run, {family} ({metric}); dotted: the targets",
        levels=levels,
    )
    return True
