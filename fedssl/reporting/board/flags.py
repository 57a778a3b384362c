"""What a board cannot vouch for (``params/board_flags.yaml``): a paper's ordering it inverts,
a known diagnosis, a line below its zero-cost reference, each a mark in a cell and a note."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from pydantic import BaseModel

from fedssl.reporting import stats
from fedssl.reporting.board.cells import (
    EVALUATIONS,
    accuracy_of,
    cost_columns,
    pipeline_entry,
    still_to_come,
)
from fedssl.reporting.board.significance import verdict_text
from fedssl.stage.record import ParamsError

# What the board cannot vouch for, marked in its cell with a note under the table that links
# the line's diagnosis. The papers' orderings and the hand-written diagnoses are data (a file
# of judgments others edit as diagnoses arrive, validated on load); which ordering the board
# inverts, and which line sits below its zero-cost reference, the board computes.
FLAGS_FILE = Path("params/board_flags.yaml")


MARK = "⚑"


DOCS_FROM_REPORT = "../../../docs/results/"  # results/reports/PIPELINE/ -> docs/results/


class PaperOrdering(BaseModel, extra="forbid"):
    """A paper's ``above`` > ``below`` (two lines of one board table, by method): the
    ``above`` line is flagged on every partition where its mean accuracy is below
    ``below``'s."""

    above: str
    below: str
    paper: str  # where and by how much the paper puts it above
    diagnosis: str  # a link, relative to docs/results/


class KnownDiagnosis(BaseModel, extra="forbid"):
    """The lines a hand-written diagnosis is about (every line matching the given fields),
    flagged in ``column`` (a board column, accuracy or cost; the line's accuracy when not
    given)."""

    method: str | None = None
    encoder: str | None = None
    partition: str | None = None
    column: str | None = None
    says: str
    diagnosis: str


class BoardFlags(BaseModel, extra="forbid"):
    """One pipeline's entry of :data:`FLAGS_FILE`; ``below_reference``: the diagnosis a line
    below its zero-cost reference (:func:`is_reference`) links."""

    orderings: list[PaperOrdering] = []
    known: list[KnownDiagnosis] = []
    below_reference: str


def load_flags(pipeline: str, path: Path = FLAGS_FILE) -> BoardFlags | None:
    """The pipeline's flags (None: no file, or no entry for it: the board flags nothing)."""
    return pipeline_entry(path, pipeline, BoardFlags)


BELOW_REFERENCE = (
    "Below its zero-cost reference (the same encoder untrained; each client alone, SOLO), "
    "by the vs reference column"
)


def flag_lines(
    cell_list: list[dict],
    flags: BoardFlags | None,
    path: Path = FLAGS_FILE,
    to_come: list[dict] = (),
) -> None:
    """Into ``cell["flags"]`` (a list of ``{"column", "kind", "note", "line", "diagnosis"}``:
    the note the flag shares with the other lines of its cause, and what it says of this
    line): the papers' orderings the board inverts, the known diagnoses, and every trained
    line whose accuracy is below its reference's (``vs_reference``: :func:`compare_lines`
    first). A flag that names no line of the board stops here, naming the file, unless the
    line is among the runs still ``to_come`` on a board made part by part (each labelled with
    its line: ``row``, ``arch``, ``column``)."""
    if flags is None:
        return
    _check_names(cell_list, flags, path, to_come)
    for cell in cell_list:
        cell["flags"] = []
    for order in flags.orderings:
        _flag_inversions(cell_list, order)
    for known in flags.known:
        for cell in cell_list:
            if all(
                getattr(known, k) in (None, cell[k]) for k in ("method", "encoder", "partition")
            ):
                column = known.column or accuracy_of(cell)
                if column in cell["values"]:
                    note = known.says[0].upper() + known.says[1:]
                    _add_flag(cell, column, "known", note, _line_name(cell), known.diagnosis)
    for cell in cell_list:
        v = cell.get("vs_reference")
        if v and v["difference"] < 0:
            line = f"{_line_name(cell)} against {v['against']}: {verdict_text(v)}"
            column = accuracy_of(cell)
            _add_flag(cell, column, "below reference", BELOW_REFERENCE, line, flags.below_reference)


def _line_name(cell: dict) -> str:
    return f"**{cell['method']}** ({cell['partition']})"


def _add_flag(cell: dict, column: str, kind: str, note: str, line: str, diagnosis: str) -> None:
    flag = {"column": column, "kind": kind, "note": note, "line": line, "diagnosis": diagnosis}
    cell["flags"].append(flag)


def _flag_inversions(cell_list: list[dict], order: PaperOrdering) -> None:
    """Flags ``order.above``'s line on each table and partition where its mean accuracy is
    below ``order.below``'s, with the difference paired by seed in its note."""
    lines = {(c["evaluation"], c["partition"], c["method"]): c for c in cell_list}
    for (evaluation, partition, method), cell in lines.items():
        other = lines.get((evaluation, partition, order.below))
        if method != order.above or other is None:
            continue
        column = accuracy_of(cell)
        if statistics.mean(cell["values"][column]) >= statistics.mean(
            other["values"].get(column, [-math.inf])
        ):
            continue
        found = stats.compare(cell["by_seed"][column], other["by_seed"].get(column, {}))
        points = f"{found.difference:+.1f}"
        points += " [{:+.1f}, {:+.1f}]".format(*found.interval) if found.interval else ""
        note = (
            f"The paper puts {order.above} above {order.below} ({order.paper}); here it is "
            f"below, in points (paired by seed, 95 % interval)"
        )
        line = f"{_line_name(cell)} {points.replace('-', '−')}"
        _add_flag(cell, column, "inverted", note, line, order.diagnosis)


def _check_names(
    cell_list: list[dict], flags: BoardFlags, path: Path, to_come: list[dict] = ()
) -> None:
    columns = {c for _, cols in EVALUATIONS.values() for c in cols} | set(cost_columns())
    named = [("orderings", i, "above", o.above) for i, o in enumerate(flags.orderings)]
    named += [("orderings", i, "below", o.below) for i, o in enumerate(flags.orderings)]
    for i, known in enumerate(flags.known):
        named += [("known", i, k, getattr(known, k)) for k in ("method", "encoder", "partition")]
        if known.column is not None and known.column not in columns:
            raise ParamsError(
                f"{path}: known.{i}.column: '{known.column}' is no accuracy or cost column of the "
                f"board ({', '.join(sorted(columns))})"
            )
    field = {"above": "method", "below": "method"}
    for section, i, key, name in named:
        key_of = field.get(key, key)
        if still_to_come(to_come, key_of, name):
            continue
        if name is not None and not any(c[key_of] == name for c in cell_list):
            raise ParamsError(f"{path}: {section}.{i}.{key}: no line of the board has '{name}'")


def flag_marks(cell: dict, column: str, notes: dict[tuple, dict]) -> str:
    """The marks of ``cell``'s flags in ``column`` (" ⚑1 ⚑2"), each note numbered the first
    time a line has it, in ``notes`` ((note, diagnosis) -> its number and lines; shared by a
    board's tables, so that a number means one note)."""
    marks = []
    for f in cell.get("flags", []):
        if f["column"] == column:
            note = notes.setdefault((f["note"], f["diagnosis"]), {"n": len(notes) + 1, "lines": []})
            note["lines"].append(f["line"])
            marks.append(note["n"])
    return "".join(f" {MARK}{n}" for n in sorted(marks))


def flag_notes(notes: dict[tuple, dict], links: str = "") -> str:
    """The notes under a table: each flag's words, its lines, and its diagnosis (``links``:
    what puts the docs' results pages before a diagnosis's link, for a page elsewhere)."""
    return "".join(
        f"- {MARK}{v['n']} {note}: {'; '.join(v['lines'])}. [Diagnosis]({links}{diagnosis})\n"
        for (note, diagnosis), v in notes.items()
    )
