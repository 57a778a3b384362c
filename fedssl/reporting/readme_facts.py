"""Numbers in the docs' sentences, generated from the committed reports like their tables.

A fact is a number in a sentence followed by its key, as a footnote reference would be
(``reads 58.0[^s0-max] % at``), and the key's definition on a line of its own at the page's
end, ``[^KEY]: PIPELINE | KIND | ARG | ...`` (continued on lines indented by four spaces, as a
footnote is), so the prose reads as prose in the source. :func:`fill_facts` rewrites each
number from its definition over ``results/reports/PIPELINE/report.json``'s rows, so a sentence
cannot drift from its file (``fedssl docs`` refills them, and the docs test fails when one is
stale); the site shows the numbers alone (:func:`strip_facts`, in ``docs/hooks.py``). On a page
with facts every footnote is a fact. A cell is the mean over the runs (seeds) of one row
(method) and column (setting); rows are named as in the report's tables (or one run by its
experiment), several joined by ``,`` (a comma and a space stay part of a name), as may be the
metrics of ``range``; ``DIGITS`` is the number of decimals (``1%``: as a percentage with one
decimal; ``+1``: with its sign) or a format spec (``.2g``). Kinds:

* ``value | ROW | COLUMN | METRIC | DIGITS``: one cell, e.g. ``69.1``;
* ``range | ROWS | COLUMN | METRIC | DIGITS``: the lowest and highest cell of those rows in
  that column (``*``: every column), ``lo-hi`` (one number when they are equal);
* ``runs | ROW | COLUMN | METRIC | DIGITS``: the lowest and highest run (seed) of one cell;
* ``sd | ROWS | COLUMN | METRIC | DIGITS``: the sample SD over the runs of a cell (the ± of
  the report's tables), the lowest and highest over those rows and columns; ``psd``: the
  population SD (CP-CFL's tables, as its paper);
* ``spread | ROWS | METRIC | DIGITS``: the rows' largest difference in one column (the
  highest cell minus the lowest), the largest over the columns;
* ``diff | ROW | OTHER | COLUMN | METRIC | DIGITS``: ROW's cell minus OTHER's in one column;
  ``ratio | ...``: ROW's cell over OTHER's;
* ``gap | ROWS | REFERENCE | METRIC | DIGITS``: over the columns, the smallest and largest
  difference between REFERENCE's cell and the rows' cells, ``lo-hi``.

A number of a committed log (a round log, a stage-times table: tab-separated with a header,
``#`` lines skipped) is defined as ``file | PATH | WHICH | COLUMN | DIGITS``, PATH from
the project's root; WHICH picks the row: ``KEY=VALUE`` (the first with that value),
``first`` or ``last`` (of the rows with a COLUMN value), ``max`` or ``min`` (of COLUMN), or
``sum`` of COLUMN (``sum KEY=VALUE``: over the rows with that value).

:func:`typed_figures` finds a score a page quotes from a report by hand, outside a fact (a
test keeps the pages free of them).
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

_NUMBER = r"[-+]?\d[\d.,]*(?:e[-+]\d+)?"
# a fact in the prose: its number (or lo-hi), then its key
MARKER = re.compile(rf"(?<![\w.\]])({_NUMBER}(?:-{_NUMBER})?)\[\^([\w-]+)\]")
# a key's definition, a line at the page's end (and its continuation lines)
DEFINITION = re.compile(r"^\[\^([\w-]+)\]: (.*(?:\n {4}\S.*)*)\n?", re.M)


def names_of(row: dict) -> set[str]:
    """What a fact may call a report row by: its table row, or its experiment (one run)."""
    return {row["row"], row.get("experiment", row["row"])}


def runs_of(rows: list[dict], metric: str, column: str = "*") -> dict[tuple[str, str], list]:
    """(row, column) -> ``metric`` of each of its runs (runs without it, or with a blank, are
    left out); each run also under (its experiment, column)."""
    runs = defaultdict(list)
    for r in rows:
        if r.get(metric) not in (None, "") and column in ("*", r["column"]):
            for name in names_of(r):
                runs[name, r["column"]].append(float(r[metric]))
    return runs


def cells(rows: list[dict], metric: str) -> dict[tuple[str, str], float]:
    """(row, column) -> mean of ``metric`` over its runs (see :func:`runs_of`)."""
    return {k: sum(v) / len(v) for k, v in runs_of(rows, metric).items()}


def _pick(table: dict, names: str, where: str) -> dict[tuple[str, str], float]:
    wanted = [n.strip() for n in re.split(r",(?! )", names)]  # "A (x, y)" is one name
    missing = [n for n in wanted if not any(row == n for row, _ in table)]
    if missing:
        raise KeyError(f"{where}: no row {', '.join(missing)}")
    return {k: v for k, v in table.items() if k[0] in wanted}


def _fmt(value: float, digits: str) -> str:
    if digits.startswith("+"):
        return f"{value:+.{int(digits[1:])}f}"
    if digits.endswith("%"):
        return f"{100 * value:.{int(digits[:-1])}f}"
    return format(value, digits) if digits.startswith((".", ",")) else f"{value:.{int(digits)}f}"


def _span(lo: float, hi: float, digits: str) -> str:
    a, b = _fmt(lo, digits), _fmt(hi, digits)
    return a if a == b else f"{a}-{b}"


def _cell(table: dict, row: str, column: str, metric: str, where: str) -> float:
    if (row, column) not in table:
        raise KeyError(f"{where}: no {metric} of row {row!r}, column {column!r}")
    return table[row, column]


class Report(NamedTuple):
    """A report's rows, and where they come from (for the messages)."""

    rows: list[dict]
    where: str


def _value(r: Report, row, column, metric, digits):
    return _fmt(_cell(cells(r.rows, metric), row, column, metric, r.where), digits)


def _runs(r: Report, row, column, metric, digits):
    found = runs_of(r.rows, metric, column).get((row, column))
    if not found:
        raise KeyError(f"{r.where}: no {metric} of row {row!r}, column {column!r}")
    return _span(min(found), max(found), digits)


def _sds(r: Report, names, column, metric, digits, sd=statistics.stdev):
    runs = _pick(runs_of(r.rows, metric, column), names, r.where)
    sds = [sd(v) for v in runs.values() if len(v) > 1]
    if not sds:
        raise KeyError(f"{r.where}: no two runs of {metric}, rows {names!r}, column {column!r}")
    return _span(min(sds), max(sds), digits)


def _sd(r: Report, names, column, metric, digits):
    return _sds(r, names, column, metric, digits)


def _psd(r: Report, names, column, metric, digits):
    return _sds(r, names, column, metric, digits, statistics.pstdev)


def _spread(r: Report, names, metric, digits):
    columns = defaultdict(list)
    for (_, col), v in _pick(cells(r.rows, metric), names, r.where).items():
        columns[col].append(v)
    return _fmt(max(max(v) - min(v) for v in columns.values()), digits)


def _diff(r: Report, row, other, column, metric, digits):
    table = cells(r.rows, metric)
    a, b = (_cell(table, name, column, metric, r.where) for name in (row, other))
    return _fmt(a - b, digits)


def _ratio(r: Report, row, other, column, metric, digits):
    table = cells(r.rows, metric)
    a, b = (_cell(table, name, column, metric, r.where) for name in (row, other))
    return _fmt(a / b, digits)


def _range(r: Report, names, column, metrics, digits):
    found = [
        v
        for metric in metrics.split(",")
        for (_, col), v in _pick(cells(r.rows, metric.strip()), names, r.where).items()
        if column in ("*", col)
    ]
    if not found:
        raise KeyError(f"{r.where}: no {metrics} of rows {names!r} in column {column!r}")
    return _span(min(found), max(found), digits)


def _gap(r: Report, names, reference, metric, digits):
    table = cells(r.rows, metric)
    ref = _pick(table, reference, r.where)
    gaps = [ref[reference, col] - v for (_, col), v in _pick(table, names, r.where).items()]
    return _span(min(gaps), max(gaps), digits)


KINDS = {
    "value": _value,
    "runs": _runs,
    "sd": _sd,
    "psd": _psd,
    "spread": _spread,
    "diff": _diff,
    "ratio": _ratio,
    "range": _range,
    "gap": _gap,
}


def fact_text(rows: list[dict], spec: list[str], where: str = "") -> str:
    """The text of the fact ``spec`` (KIND and its arguments) over a report's rows."""
    kind, *args = spec
    compute = KINDS.get(kind)
    if compute is None or len(args) != compute.__code__.co_argcount - 1:
        raise ValueError(
            f"{where}: unknown fact {' | '.join(spec)!r} (see fedssl.reporting.readme_facts)"
        )
    return compute(Report(rows, where), *args)


def log_fact(path: Path, which: str, column: str, digits: str) -> str:
    """One number of a committed tab-separated log (see the module doc)."""
    lines = [x for x in path.read_text().splitlines() if x and not x.startswith("#")]
    rows = [dict(zip(lines[0].split("\t"), x.split("\t"))) for x in lines[1:]]
    if rows and column not in rows[0]:
        raise KeyError(f"{path}: no column {column!r}")
    values = [(r, float(r[column])) for r in rows if r.get(column, "") != ""]
    if which.startswith("sum"):
        key, _, wanted = which[3:].strip().partition("=")
        values = [({}, sum(v for r, v in values if not key or r.get(key) == wanted))]
    elif "=" in which:
        key, _, wanted = which.partition("=")
        values = [(r, v) for r, v in values if r.get(key) == wanted][:1]
    elif which in ("first", "last"):
        values = values[:1] if which == "first" else values[-1:]
    elif which in ("max", "min"):
        values = [(max if which == "max" else min)(values, key=lambda rv: rv[1])] if values else []
    else:
        raise ValueError(f"{path}: unknown row {which!r} (KEY=VALUE, first, last, max, min)")
    if not values:
        raise KeyError(f"{path}: no {column} in the row {which!r}")
    return _fmt(values[0][1], digits)


def definitions(text: str) -> dict[str, str]:
    """A page's facts: key -> definition (its continuation lines joined)."""
    found = {}
    for m in DEFINITION.finditer(text):
        if m.group(1) in found:
            raise KeyError(f"fact [^{m.group(1)}] defined twice")
        found[m.group(1)] = re.sub(r"\n {4}", " ", m.group(2)).strip()
    return found


def fact_value(definition: str, results_root: Path) -> str:
    """The number a definition gives, from its pipeline's report (or its log, under the
    project's root: ``results_root``'s grandparent)."""
    source, *spec = [a.strip() for a in definition.split("|")]
    if source == "file" and len(spec) == 4:
        return log_fact(results_root.parent.parent / spec[0], *spec[1:])
    path = results_root / source / "report.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no report of pipeline '{source}' (run it)")
    return fact_text(json.loads(path.read_text())["rows"], spec, str(path))


def fill_facts(text: str, results_root: Path) -> str:
    """``text`` with every fact's number regenerated from its definition; a key without a
    definition, or a definition no number uses, is an error that names it."""
    if "<!-- fact:" in text:
        raise ValueError("an inline <!-- fact: ... --> tag: write NUMBER[^KEY] and its definition")
    defined = definitions(text)
    first = DEFINITION.search(text)
    if first and DEFINITION.sub("", text[first.start() :]).strip():
        raise ValueError(f"text after the fact definitions, which end the page: {first.group(0)!r}")
    used = {m.group(2) for m in MARKER.finditer(DEFINITION.sub("", text))}
    if unknown := sorted(used - set(defined)):
        raise KeyError(f"facts without a definition ([^KEY]: ... at the page's end): {unknown}")
    if unused := sorted(set(defined) - used):
        raise KeyError(f"facts defined but not in the text (a number then [^KEY]): {unused}")
    values = {key: fact_value(d, results_root) for key, d in defined.items()}
    return MARKER.sub(lambda m: f"{values[m.group(2)]}[^{m.group(2)}]", text)


def strip_facts(text: str) -> str:
    """``text`` as the site shows it: each fact's number alone, the definitions gone."""
    return MARKER.sub(r"\1", DEFINITION.sub("", text)).rstrip("\n") + "\n"


_INLINE = re.compile(r"<!-- fact: (.+?) -->(.*?)<!-- /fact -->", re.S)


def keyed(text: str, width: int = 100) -> str:
    """``text`` with its inline ``<!-- fact: DEFINITION -->NUMBER<!-- /fact -->`` tags (this
    module's former syntax, still in branches written before it) as ``NUMBER[^KEY]``, keys
    numbered after the page's, the definitions appended, wrapped at ``width``."""
    keys = dict.fromkeys(definitions(text))
    start = 1 + max((int(k) for k in keys if k.isdigit()), default=0)
    found = {}

    def key(m: re.Match) -> str:
        definition = re.sub(r"\s+", " ", m.group(1))
        found.setdefault(definition, str(start + len(found)))
        return f"{m.group(2)}[^{found[definition]}]"

    text = _INLINE.sub(key, text)
    lines = [wrapped(f"[^{k}]: {d}", width) for d, k in found.items()]
    return text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n" if lines else text


def wrapped(line: str, width: int) -> str:
    """A definition's line broken after its ``|`` separators, continued four spaces in."""
    out = [""]
    for part in re.split(r"(?<=\|) ", line):
        if out[-1].strip() and len(out[-1]) + 1 + len(part) > width:
            out.append("   ")
        out[-1] += (" " if out[-1] else "") + part
    return "\n".join(out)


# what a page's prose is, for :func:`typed_figures`: generated blocks, facts, code and table
# rows are not
_NOT_PROSE = re.compile(
    r"<!-- (results|board|figures): [^>]*-->.*?<!-- /\1 -->|```.*?```|^\|.*$",
    re.S | re.M,
)
_SCORES = re.compile(r"top1|auroc|personal|^ari$|^purity$")  # the metrics a sentence quotes
# 79.4, 79.40; not 1.2.3, nor a signed difference (+9.9, −2.6), which no report cell is
_FIGURE = re.compile(r"(?<![\w.+−])\d+\.\d{1,2}(?![\d.]*\d)")


def typed_figures(text: str, results_root: Path) -> list[str]:
    """Numbers in a page's prose, outside its facts, that equal a score cell (to their
    decimals) of a report the page names (a results or board block, a fact, or `PIPELINE` in
    backticks): a figure typed by hand from a committed file, which would not follow it."""
    names = set(re.findall(r"<!-- (?:results|board): (\w+)", text))
    names |= {d.split("|")[0].strip() for d in definitions(text).values()}
    names |= set(re.findall(r"`(\w+)`", text))
    cells_text = set()
    for name in names:
        path = results_root / name / "report.json"
        if not path.exists():
            continue
        rows = json.loads(path.read_text())["rows"]
        for metric in {k for r in rows for k in r if _SCORES.search(k)}:
            for value in cells(rows, metric).values():
                cells_text |= {f"{value:.1f}", f"{value:.2f}"}
    prose = _NOT_PROSE.sub("", MARKER.sub("", DEFINITION.sub("", text)))
    return [n for n in _FIGURE.findall(prose) if float(n) >= 1 and n in cells_text]
