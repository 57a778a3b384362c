"""Numbers in the docs' sentences, generated from the committed reports like their tables.

A fact is an inline block ``<!-- fact: PIPELINE | KIND | ARG | ... -->TEXT<!-- /fact -->``;
:func:`fill_facts` rewrites TEXT from ``results/reports/PIPELINE/report.json``'s rows, so a
sentence cannot drift from its file (``fedssl docs`` refills them, and the docs test fails
when one is stale). A cell is the mean over the runs (seeds) of one row
(method) and column (setting); rows are named as in the report's tables, several joined by
``,``; ``DIGITS`` is the number of decimals. Kinds:

* ``value | ROW | COLUMN | METRIC | DIGITS``: one cell, e.g. ``69.1``;
* ``range | ROWS | COLUMN | METRIC | DIGITS``: the lowest and highest cell of those rows in
  that column (``*``: every column), ``lo-hi`` (one number when they are equal);
* ``runs | ROW | COLUMN | METRIC | DIGITS``: the lowest and highest run (seed) of one cell;
* ``gap | ROWS | REFERENCE | METRIC | DIGITS``: over the columns, the smallest and largest
  difference between REFERENCE's cell and the rows' cells, ``lo-hi``.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

FACT = re.compile(r"<!-- fact: (\w+) \| (.+?) -->(.*?)<!-- /fact -->", re.S)


def cells(rows: list[dict], metric: str) -> dict[tuple[str, str], float]:
    """(row, column) -> mean of ``metric`` over its runs (runs without it are left out)."""
    runs = defaultdict(list)
    for r in rows:
        if r.get(metric) is not None:
            runs[r["row"], r["column"]].append(float(r[metric]))
    return {k: sum(v) / len(v) for k, v in runs.items()}


def _pick(table: dict, names: str, where: str) -> dict[tuple[str, str], float]:
    wanted = [n.strip() for n in names.split(",")]
    missing = [n for n in wanted if not any(row == n for row, _ in table)]
    if missing:
        raise KeyError(f"{where}: no row {', '.join(missing)}")
    return {k: v for k, v in table.items() if k[0] in wanted}


def _span(lo: float, hi: float, digits: int) -> str:
    a, b = f"{lo:.{digits}f}", f"{hi:.{digits}f}"
    return a if a == b else f"{a}-{b}"


def fact_text(rows: list[dict], spec: list[str], where: str = "") -> str:
    """The text of the fact ``spec`` (KIND and its arguments) over a report's rows."""
    kind, *args = spec
    if kind == "value" and len(args) == 4:
        row, column, metric, digits = args
        table = cells(rows, metric)
        if (row, column) not in table:
            raise KeyError(f"{where}: no {metric} of row {row!r}, column {column!r}")
        return f"{table[row, column]:.{int(digits)}f}"
    if kind == "runs" and len(args) == 4:
        row, column, metric, digits = args
        found = [float(r[metric]) for r in rows if (r["row"], r["column"]) == (row, column)]
        if not found:
            raise KeyError(f"{where}: no {metric} of row {row!r}, column {column!r}")
        return _span(min(found), max(found), int(digits))
    if kind == "range" and len(args) == 4:
        names, column, metric, digits = args
        picked = _pick(cells(rows, metric), names, where).items()
        found = [v for (_, col), v in picked if column in ("*", col)]
        if not found:
            raise KeyError(f"{where}: no {metric} of rows {names!r} in column {column!r}")
        return _span(min(found), max(found), int(digits))
    if kind == "gap" and len(args) == 4:
        names, reference, metric, digits = args
        table = cells(rows, metric)
        ref = _pick(table, reference, where)
        gaps = [ref[reference, col] - v for (_, col), v in _pick(table, names, where).items()]
        return _span(min(gaps), max(gaps), int(digits))
    raise ValueError(f"{where}: unknown fact {' | '.join(spec)!r} (see fedssl.readme_facts)")


def fill_facts(text: str, results_root: Path) -> str:
    """``text`` with every fact block's TEXT regenerated from its pipeline's report."""

    def fill(m: re.Match) -> str:
        path = results_root / m.group(1) / "report.json"
        if not path.exists():
            raise FileNotFoundError(f"{path}: no report of pipeline '{m.group(1)}' (run it)")
        spec = [a.strip() for a in m.group(2).split("|")]
        value = fact_text(json.loads(path.read_text())["rows"], spec, str(path))
        return f"<!-- fact: {m.group(1)} | {m.group(2)} -->{value}<!-- /fact -->"

    return FACT.sub(fill, text)
