"""Figures for reading, shared by the reports and the board: small multiples (one panel per
partition or per method), the Pareto front of accuracy against a cost, labels placed without
overlap (adjustText), learning curves as the median with a band over seeds, and diverged
runs drawn as a marked end point that never sets an axis' scale.

The numbers are worked out by small pure functions (:func:`pareto_front`, :func:`band`,
:func:`diverged`, :func:`robust_limits`), tested on their own; the drawing functions only lay
them out."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedssl.reporting.formatting import save_figure

# A run's loss this many times its median over rounds (or a value that is not finite) is a
# divergence, not a curve to read.
DIVERGED_FACTOR = 10.0
# Characters of an 8-point panel title that fit in an inch of panel (with the gap between
# panels), for wrapping titles before they run into their neighbours.
TITLE_CHARS_PER_INCH = 14


# ------------------------------------------------------------------ the numbers
def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats: none has a lower-or-equal cost (x) and a
    higher-or-equal accuracy (y) with one of them strictly better; in order of cost."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def band(runs: Sequence[Sequence[float]]) -> tuple[list[float], list[float], list[float]]:
    """Median, low and high (min and max) over runs at each step, over the steps every run
    has (the curves of one line over its seeds)."""
    steps = min((len(r) for r in runs), default=0)
    columns = [[r[i] for r in runs] for i in range(steps)]
    return (
        [statistics.median(c) for c in columns],
        [min(c) for c in columns],
        [max(c) for c in columns],
    )


def diverged(values: Sequence[float], steps: int, is_loss: bool) -> bool:
    """Whether a run's curve is a divergence: a value that is not finite, a log that stops
    before its line's other runs (``steps``: theirs), or a loss grown past
    :data:`DIVERGED_FACTOR` times its median over the run."""
    if not values or any(not math.isfinite(v) for v in values) or len(values) < steps:
        return True
    return is_loss and max(values) > DIVERGED_FACTOR * abs(statistics.median(values))


def seeds_caption(counts: Iterable[int]) -> str:
    """What a curve is, true to how many runs each line has (its seeds, or in a sweep the
    settings that share its label: a tuning part's rates)."""
    counts = sorted(set(counts))
    if counts == [1]:
        return "one run per line"
    many = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"median over {many} runs a line (its seeds or swept settings), band = min to max"


def robust_limits(values: Iterable[float], pad: float = 0.05) -> tuple[float, float] | None:
    """Axis limits that hold every (finite) value with a margin; None without values."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    lo, hi = min(finite), max(finite)
    margin = (hi - lo) * pad or abs(hi) * pad or 1.0
    return lo - margin, hi + margin


def wrap_title(title: str, chars: int, sep: str = " · ") -> str:
    """A panel title broken at its separators into lines of at most ``chars`` characters
    where it can be (a part longer than that keeps a line of its own): side by side, long
    titles would run into their neighbours'."""
    lines = []
    for line in title.split("\n"):
        parts = line.split(sep)
        current = parts[0]
        for part in parts[1:]:
            if len(current) + len(sep) + len(part) <= chars:
                current += sep + part
            else:
                lines.append(current + sep.rstrip())
                current = part
        lines.append(current)
    return "\n".join(lines)


def grid_shape(panels: int, columns: int = 4) -> tuple[int, int]:
    """Rows and columns of a small-multiples grid."""
    cols = max(1, min(columns, panels))
    return max(1, math.ceil(panels / cols)), cols


# ------------------------------------------------------------------ drawing
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def log_axis(ax) -> None:
    """A log-scaled x axis whose ticks read as plain numbers (1, 2, 5, 10, ...), also over
    less than a decade."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def colours_for(plt, names: list[str]) -> dict:
    """A colour per name: tab20's ten dark hues first, then their light shades (tab20 in
    its own order pairs each dark hue with its light one, so neighbours look alike)."""
    cmap = plt.get_cmap("tab20")
    return {n: cmap((2 * i + i // 10) % 20) for i, n in enumerate(names)}


def colours_apart(plt, panels: Iterable[Iterable[str]]) -> dict:
    """A colour per name of ``panels`` (each the names drawn together) among tab10's ten
    dark hues, names that share a panel in different hues (up to ten a panel), each name
    the least-used hue its panels leave: tab20's light twins beside their dark hues read as
    one line. A hue may return on another panel: such a figure keys each row in its panel
    (:func:`learning_curves`' ``keyed``)."""
    cmap = plt.get_cmap("tab10")
    together: dict[str, set[str]] = {}
    for names in panels:
        names = list(names)
        for n in names:
            together.setdefault(n, set()).update(m for m in names if m != n)
    chosen: dict[str, int] = {}
    for name, others in together.items():
        near = {chosen[o] for o in others if o in chosen}
        uses = [list(chosen.values()).count(h) for h in range(10)]
        chosen[name] = min(range(10), key=lambda h: (h in near, uses[h], h))
    return {n: cmap(h) for n, h in chosen.items()}


def _label(ax, xs, ys, texts, fontsize=6) -> None:
    """Point labels moved apart from each other and from the points (adjustText)."""
    from adjustText import adjust_text

    labels = [ax.text(x, y, t, fontsize=fontsize) for x, y, t in zip(xs, ys, texts)]
    if labels:
        adjust_text(
            labels,
            x=list(xs),
            y=list(ys),
            ax=ax,
            arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.5},
            expand=(1.2, 1.4),
            iter_lim=300,  # a fixed number of steps, not its default 1 s: the same bytes each time
        )


def _levels(ax, marks: Iterable[tuple[str, float]], gap_pt: float = 8.5) -> None:
    """Labelled dotted levels across a panel (a target, an untrained network's accuracy), the
    labels at the left end, those of close levels pushed apart upwards."""
    for label, y, shift in _stacked(ax, marks, gap_pt):
        ax.axhline(y, color="0.4", ls=":", lw=1)
        ax.annotate(label, (0.01, y), xycoords=("axes fraction", "data"), fontsize=6,
                    color="0.3", va="bottom", xytext=(0, shift), textcoords="offset points",
                    bbox={"fc": "white", "alpha": 0.7, "lw": 0, "pad": 0.3})  # fmt: skip


def _margin_levels(ax, marks: list[tuple[str, float]], gap_pt: float = 8.5) -> None:
    """Dotted levels labelled in the panel's right margin, where no point can sit under their
    label; labels of close levels pushed apart upwards."""
    for label, y, shift in _stacked(ax, marks, gap_pt):
        ax.axhline(y, color="0.4", ls=":", lw=1)
        ax.annotate(label, (1.0, y), xycoords=("axes fraction", "data"), fontsize=6,
                    color="0.3", va="center", ha="left", annotation_clip=False,
                    xytext=(2, shift), textcoords="offset points")  # fmt: skip


def _stacked(ax, marks: Iterable[tuple[str, float]], gap_pt: float):
    """``(label, y, shift in points)`` from the lowest level up: each label's centre at least
    ``gap_pt`` (a 6 pt line and a margin) per line of the two labels' half heights above the
    one below it."""
    ax.autoscale_view()
    px_per_pt = ax.figure.dpi / 72
    last, last_lines = -math.inf, 0
    for label, y in sorted(marks, key=lambda m: m[1]):
        lines = label.count("\n") + 1
        at = ax.transData.transform((1.0, y))[1]
        shift = max(0.0, last + (last_lines + lines) / 2 * gap_pt * px_per_pt - at)
        last, last_lines = at + shift, lines
        yield label, y, shift / px_per_pt


def _cost_panel(ax, points: list[dict], colours: dict, numbered: dict[str, int]) -> list[str]:
    """One partition's points with their error bars and the Pareto front as a step line;
    returns their labels: a name on the front, a number (shared by all panels: ``numbered``)
    off it."""
    for p in points:
        colour = colours[p["group"]]
        ax.errorbar(
            p["x"], p["y"], yerr=p.get("err") or 0, marker="o", ms=4, capsize=2,
            linestyle="none", color=colour, mfc="white" if p.get("reference") else colour,
        )  # fmt: skip
    methods = [i for i, p in enumerate(points) if not p.get("reference")]
    front = [methods[i] for i in pareto_front([(points[i]["x"], points[i]["y"]) for i in methods])]
    if front:
        xs = [points[i]["x"] for i in front]
        ax.step(xs, [points[i]["y"] for i in front], where="post", color="k", lw=0.8,
                alpha=0.6, label="Pareto front")  # fmt: skip
    return [
        p["label"] if i in front else str(numbered.setdefault(p["label"], len(numbered) + 1))
        for i, p in enumerate(points)
    ]


def numbered_key(numbered: dict[str, int], chars: int) -> list[str]:
    """The numbered lines' names under a figure, wrapped at ``chars`` between two names, never
    inside one (a line ending on "21:" with its name on the next reads as another name's)."""
    import textwrap

    names = [f"{n}: {label}".replace(" ", "\u00a0") for label, n in numbered.items()]
    text = "Off the front: " + "   ".join(names)
    return textwrap.wrap(text, chars, break_on_hyphens=False) if names else []


def _cost_key(plt, fig, colours: dict, numbered: dict[str, int], hollow: bool) -> None:
    """The key under the panels: a colour per group, the front, the hollow reference mark
    where one is drawn, and the numbered lines."""
    handles = [
        plt.Line2D([], [], marker="o", ls="none", color=c, label=g) for g, c in colours.items()
    ]
    handles.append(plt.Line2D([], [], color="k", lw=0.8, label="Pareto front (labelled)"))
    if hollow:
        handles.append(plt.Line2D([], [], marker="o", ls="none", color="0.4", mfc="white",
                                  label="untrained reference"))  # fmt: skip
    fig.legend(handles=handles, loc="lower center", ncol=min(6, len(handles)), fontsize=7,
               frameon=False, bbox_to_anchor=(0.5, 0.0))  # fmt: skip
    if numbered:
        fig.text(0.01, 0.045, "\n".join(numbered_key(numbered, 230)), fontsize=6,
                 va="bottom")  # fmt: skip


def accuracy_vs_cost(
    panels: dict[str, list[dict]],
    xlabel: str,
    ylabels: dict[str, str],
    path: Path,
    title: str = "",
    references: dict[str, list[dict]] | None = None,
) -> None:
    """Small multiples, one panel per partition: each line a point (``x`` its cost, ``y`` its
    mean accuracy, ``err`` its SD, ``label``, ``group`` its colour, ``reference``: an
    untrained network, hollow and kept off the front), the cost axis log-scaled, the Pareto
    front (the methods no other method beats in both) drawn and its points labelled by name,
    the others by number with their names in the key below the panels (no legend over data).
    ``references`` (per panel: ``label``, ``y``) are lines that cost nothing: a dotted level
    at their accuracy."""
    plt = _pyplot()
    names = list(panels)
    rows, cols = grid_shape(len(names), 3)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.4 * rows), squeeze=False)
    groups = list(dict.fromkeys(p["group"] for pts in panels.values() for p in pts))
    colours = colours_for(plt, groups)
    numbered: dict[str, int] = {}  # lines off the front: number -> name, shared by all panels
    for ax, name in zip(axes.flat, names):
        points = [p for p in panels[name] if p["x"] is not None and p["x"] > 0]
        log_axis(ax)  # before the labels are placed: they are placed in display space
        texts = _cost_panel(ax, points, colours, numbered)
        _margin_levels(ax, [(r["label"], r["y"]) for r in (references or {}).get(name, [])])
        _label(ax, [p["x"] for p in points], [p["y"] for p in points], texts)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabels.get(name, ""), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, which="both")
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    hollow = any(p.get("reference") for pts in panels.values() for p in pts)
    _cost_key(plt, fig, colours, numbered, hollow)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 0.97 if title else 1))
    save_figure(fig, path, dpi=90)
    plt.close(fig)


def _curves(ax, lines: dict, colours: dict, is_loss: bool, name: str, gone: list[str]):
    """Draw one panel's lines (median and band over the runs that did not diverge); returns
    the runs drawn (their values set the scale) and the diverged runs' last finite points,
    and appends those runs' names to ``gone``."""
    kept_runs, ends = [], []
    for line, runs in lines.items():
        steps = max(len(y) for _, y in runs)
        good = [(x, y) for x, y in runs if not diverged(y, steps, is_loss)]
        for i, (x, y) in enumerate(runs):
            if (x, y) not in good:
                finite = [(a, b) for a, b in zip(x, y) if math.isfinite(b)]
                ends.append(finite[-1] if finite else (x[0], math.nan))
                gone.append(f"{name} / {line} #{i}")
        if not good:
            continue
        xs = min((x for x, _ in good), key=len)
        median, low, high = band([y for _, y in good])
        xs = xs[: len(median)]
        ax.plot(xs, median, color=colours[line], lw=1.2, marker="." if len(xs) < 12 else None)
        if len(good) > 1:
            ax.fill_between(xs, low, high, color=colours[line], alpha=0.2, lw=0)
        kept_runs += [list(y) for _, y in good]
    return kept_runs, ends


def _diverged_ends(ax, ends: list[tuple[float, float]], limits) -> None:
    """A red ``x`` at each diverged run's last finite point, pinned to the panel's top (and
    labelled with its value) when beyond it, so it never sets the scale."""
    for x, y in ends:
        if math.isnan(y):
            continue
        top = limits[1] if limits else y
        shown = min(y, top)
        ax.plot([x], [shown], marker="x", color="red", ms=7, mew=2, clip_on=False)
        if y > top:
            ax.annotate(f"diverged ({y:.2g})", (x, shown), fontsize=6, color="red",
                        ha="right", va="top")  # fmt: skip


def _curve_panel(
    ax, name: str, lines: dict, colours: dict, gone: list[str], *, is_loss: bool, log: bool,
    marks: list[tuple[str, float]], xlabel: str, ylabel: str, title_chars: int,
    zoom: float | None = None,
) -> None:  # fmt: skip
    """One panel of :func:`learning_curves`: its lines, levels and diverged runs, scaled to
    what did not diverge (to the last ``zoom`` share of each run's points, where given)."""
    from matplotlib.ticker import MaxNLocator

    xs_all = {x for runs in lines.values() for xs, _ in runs for x in xs}
    if len(xs_all) == 1:  # one round: each line's value over its name, not a lone dot
        _one_round_panel(ax, lines, colours)
        ax.set_title(wrap_title(name, title_chars), fontsize=8)
        ax.set_xlabel(f"{xlabel} {min(xs_all):g}, the only one logged", fontsize=7)
        ax.set_ylabel(ylabel, fontsize=7)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3, axis="y")
        return
    kept_runs, ends = _curves(ax, lines, colours, is_loss, name, gone)
    start = (lambda y: int(len(y) * (1 - zoom))) if zoom else (lambda y: 0)
    kept_values = [v for y in kept_runs for v in y[start(y) :]]
    limits = robust_limits(kept_values + [y for _, y in marks])
    if limits:
        ax.set_ylim(*limits)
    _levels(ax, marks)  # on the final scale: close levels' labels are pushed apart on it
    _diverged_ends(ax, ends, limits)
    if log:
        log_axis(ax)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(wrap_title(name, title_chars), fontsize=8)
    ax.set_xlabel(xlabel, fontsize=7)
    ax.set_ylabel(ylabel, fontsize=7)
    ax.tick_params(labelsize=6)
    ax.grid(alpha=0.3)


def _one_round_panel(ax, lines: dict, colours: dict) -> None:
    """A panel whose runs log one round: a column per line, a marker per run and the lines'
    median written beside it."""
    for i, (line, runs) in enumerate(lines.items()):
        ys = [y[0] for _, y in runs if y]
        ax.plot([i] * len(ys), ys, ls="none", marker="o", ms=4, color=colours[line])
        if ys:
            ax.annotate(f"{statistics.median(ys):.3g}", (i, statistics.median(ys)), fontsize=6,
                        xytext=(6, 0), textcoords="offset points", va="center")  # fmt: skip
    ax.set_xticks(range(len(lines)), [wrap_title(line, 12, " ") for line in lines], fontsize=6)
    ax.set_xlim(-0.5, len(lines) - 0.5)


def _curve_key(plt, fig, colours: dict, diverged_runs: bool) -> int:
    """The key under the panels (a colour per line, the diverged-run mark if any); returns
    how many lines of text it takes."""
    handles = [plt.Line2D([], [], color=c, lw=2, label=line) for line, c in colours.items()]
    if diverged_runs:
        handles.append(plt.Line2D([], [], marker="x", color="red", ls="none", label="diverged run"))
    if not handles:
        return 0
    fig.legend(handles=handles, loc="lower center", ncol=min(5, len(handles)), fontsize=7,
               frameon=False)  # fmt: skip
    return math.ceil(len(handles) / min(5, len(handles)))


@dataclass(frozen=True)
class CurveLook:
    """How :func:`learning_curves` draws beyond its defaults: ``colours`` (line -> colour;
    None: :func:`colours_for` in order of appearance), ``zoom`` (the share of each run's last
    points that sets a panel's y-axis, so lines that end close are told apart while their
    first rounds rise in from below; None: every point), ``keyed`` (panels that key their own
    lines, :func:`_keys`)."""

    colours: dict | None = None
    zoom: float | None = None
    keyed: tuple[str, ...] = ()


def _keys(plt, fig, axes: dict, panels: dict, colours: dict, keyed, diverged_runs: bool) -> int:
    """The ``keyed`` panels' keys of their own lines, and the figure's key of the other lines
    (:func:`_curve_key`); returns how many lines of text the figure's key takes."""
    keyed = [n for n in keyed if n in panels]
    for name in keyed:
        handles = [plt.Line2D([], [], color=colours[n], lw=2, label=n) for n in panels[name]]
        axes[name].legend(handles=handles, fontsize=5.5, loc="best", framealpha=0.85)
    drawn = {line for lines in panels.values() for line in lines}
    in_keys = {line for n in keyed for line in panels[n]}
    rest = {n: c for n, c in colours.items() if n in drawn and n not in in_keys}
    return _curve_key(plt, fig, rest, diverged_runs)


def learning_curves(
    panels: dict[str, dict[str, list[tuple[list[float], list[float]]]]],
    ylabels: dict[str, str],
    path: Path,
    xlabel: str | dict[str, str] = "round",
    loss_panels: Iterable[str] = (),
    title: str = "",
    columns: int = 4,
    log_x: Iterable[str] = (),
    levels: dict[str, list[tuple[str, float]]] | None = None,
    look: CurveLook = CurveLook(),
) -> list[str]:
    """Small multiples, one panel per method or family: per line (a setting, e.g. a partition)
    the median over its runs (seeds) with a band from the lowest to the highest; a run that
    diverged (:func:`diverged`) is left out of its band and drawn as a red ``x`` at its last
    finite point, pinned to the panel's edge when beyond it, so it never sets the scale.
    ``panels``: panel -> line -> its runs as (x, y) lists; ``ylabels``: panel -> the metric's
    name; ``loss_panels``: panels whose metric is a loss; ``log_x``: panels whose x is a
    cost (log-scaled); ``levels``: per panel, labelled dotted levels (a target, a
    reference); ``look``: colours, zoom and keys (:class:`CurveLook`). Returns the diverged
    runs as ``panel / line #i``."""
    plt = _pyplot()
    names = list(panels)
    loss_panels, log_x = set(loss_panels), set(log_x)
    rows, cols = grid_shape(len(names), columns)
    width = max(3.6 * cols, 6.0)  # room for the title and the key under one panel
    fig, axes = plt.subplots(rows, cols, figsize=(width, 2.7 * rows + 0.6), squeeze=False)
    lines_all = list(dict.fromkeys(line for lines in panels.values() for line in lines))
    colours, gone = look.colours or colours_for(plt, lines_all), []
    for ax, name in zip(axes.flat, names):
        _curve_panel(
            ax, name, panels[name], colours, gone,
            is_loss=name in loss_panels,
            log=name in log_x,
            marks=(levels or {}).get(name, []),
            zoom=look.zoom,
            xlabel=xlabel if isinstance(xlabel, str) else xlabel.get(name, ""),
            ylabel=ylabels.get(name, ""),
            title_chars=int(width / cols * TITLE_CHARS_PER_INCH),
        )  # fmt: skip
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    key_rows = _keys(plt, fig, dict(zip(names, axes.flat)), panels, colours, look.keyed, bool(gone))
    counts = [len(runs) for lines in panels.values() for runs in lines.values()]
    fig.suptitle((title + "\n" if title else "") + seeds_caption(counts), fontsize=9)
    height = 2.7 * rows + 0.6
    fig.tight_layout(rect=(0, (0.2 + 0.16 * key_rows) / height, 1, 1 - 0.35 / height))
    save_figure(fig, path, dpi=80)
    plt.close(fig)
    return gone
