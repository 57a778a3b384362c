"""The pieces every report table and figure is made of, in one place: a Markdown table, a
mean ± SD cell whose SD convention is explicit (and stated in the caption of every table that
uses it), a number, a pivot of runs, ranks within a column, a paper's table read from a TSV,
and figure saving that writes the same PNG bytes on a rerun.

Pure Python, and it imports nothing of the project: a method's table module may use it
without pulling the planning or training code into the report's dependencies."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Literal

Sd = Literal["sample", "population"]
# How each convention is computed and how a caption names it.
_SD = {
    "sample": (statistics.stdev, "sample SD"),
    "population": (statistics.pstdev, "population SD"),
}


def _convention(sd: Sd) -> tuple:
    if sd not in _SD:
        raise ValueError(f"sd: expected one of {', '.join(_SD)}, got {sd!r}")
    return _SD[sd]


def to_float(value) -> float | None:
    """A report value as a number: None for a blank, a missing value or text that is not a
    number; a flag (True / False, or its text in a CSV) as 1 / 0."""
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "false"):
            return float(text == "true")
        try:
            return float(text)
        except ValueError:
            return None
    return float(value)


def numbers(rows: list[dict], key: str) -> list[float]:
    """The numeric values of ``key`` over ``rows`` (blanks and missing values left out)."""
    return [v for v in (to_float(r.get(key)) for r in rows) if v is not None]


def number(value, spec: str = ".3g", blank: str = "") -> str:
    """One number formatted by ``spec`` (``format`` syntax); ``blank`` when there is none."""
    v = to_float(value)
    return blank if v is None else format(v, spec)


def mean_sd(values: list[float], sd: Sd, spec: str = ".2f") -> str:
    """``mean±SD`` over repeated runs with the given SD convention, both formatted by
    ``spec``; one run shows its value alone and no run a blank cell."""
    spread = _convention(sd)[0]
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return format(values[0], spec) if values else ""
    return f"{format(statistics.mean(values), spec)}±{format(spread(values), spec)}"


def sd_note(sd: Sd, over: str = "runs") -> str:
    """The caption's words for :func:`mean_sd` cells, e.g. "mean ± sample SD over runs" (a
    table that shows such cells says so in its caption)."""
    return f"mean ± {_convention(sd)[1]} over {over}"


def markdown_table(header: list[str], lines: list[list[str]], caption: str = "") -> str:
    """A Markdown table, with its caption in italics above it when there is one."""
    if any(len(line) != len(header) for line in lines):
        raise ValueError(f"every line needs {len(header)} cells ({', '.join(header)})")
    out = [f"*{caption}*", ""] if caption else []
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out) + "\n"


def pivot_markdown(
    rows: list[dict],
    key: str,
    title: str,
    sd: Sd = "sample",
    spec: str = ".2f",
    means: dict[str, str] | None = None,
) -> str:
    """``key`` per cell of the rows' ``row`` (down) and ``column`` (across), both in
    first-seen order, as mean ± SD over the runs sharing a cell; then, per header of
    ``means``, the mean of that column over all runs of the row (blank when none has it). The
    caption is the title with the SD convention."""
    means = means or {}
    row_labels = list(dict.fromkeys(r["row"] for r in rows))
    col_labels = list(dict.fromkeys(r["column"] for r in rows))
    cells: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        cells.setdefault((r["row"], r["column"]), []).append(to_float(r.get(key)))
    lines = []
    for label in row_labels:
        runs = [r for r in rows if r["row"] == label]
        lines.append(
            [
                label,
                *(mean_sd(cells.get((label, c), []), sd, spec) for c in col_labels),
                *(
                    number(statistics.mean(v)) if (v := numbers(runs, column)) else ""
                    for column in means.values()
                ),
            ]
        )
    return markdown_table(["method", *col_labels, *means], lines, f"{title}; {sd_note(sd)}")


def ranked(cells: dict[str, tuple[float, str]]) -> dict[str, str]:
    """label -> (value, cell text) as label -> the cell text with its rank among the labels
    ("71.0±1.4 (2)"; 1 = highest, ties share a rank), so that a paper's ordering and ours
    read side by side."""

    def rank(value: float) -> int:
        return 1 + sum(other > value for other, _ in cells.values())

    return {label: f"{text} ({rank(value)})" for label, (value, text) in cells.items()}


def paper_row(labels: list[str], method: str, setting: str = "") -> str | None:
    """Which of our row labels stands beside the paper's row ``method``: the one whose method
    part (before " (") is ``method``; among several, the one naming the paper's ``setting``
    (e.g. "μ=10"); none where that still leaves several or none."""
    mine = [label for label in labels if label.split(" (")[0] == method]
    if len(mine) > 1 and setting:
        mine = [label for label in mine if setting in label]
    return mine[0] if len(mine) == 1 else None


def read_tsv(path: Path) -> list[dict[str, str]]:
    """A tab-separated table with a header line; lines starting with ``#`` are comments (a
    paper's table shipped beside the code that compares with it)."""
    with Path(path).open() as f:
        return list(
            csv.DictReader((line for line in f if not line.startswith("#")), delimiter="\t")
        )


def save_figure(fig, path: Path, dpi: int = 100) -> None:
    """Save a Matplotlib figure as PNG at a fixed resolution and without the metadata that
    would differ between runs or versions (the Software tag), so the same inputs give the
    same bytes."""
    fig.savefig(path, format="png", dpi=dpi, metadata={"Software": None})
