"""``fedssl advise --partition P [--mb-per-client X] [--client-gflops Y] [--peak-mb Z]``: the
board's lines that fit a client's budget on a partition, ranked by accuracy with their 95 %
intervals, and which of the differences from the top line the runs resolve.

A line fits when each budgeted cost's mean over its runs is within the budget (a line that
lacks a budgeted cost does not fit: its cost is unknown). The zero-cost references fit every
budget and stay in the ranking: a user may be best served by federating nothing. The top line
of each evaluation is compared with every other fitting line under the variance the board's
planned questions use (:mod:`.questions`: pooled over the fitting lines of the two lines'
encoders, blocked, or paired over the runs the two lines share), Holm-adjusted over those
comparisons; an unresolved difference is printed with its minimum detectable effect."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from fedssl.evaluations.costs import CLIENT_GFLOPS, CLIENT_MB_EXCHANGED, PEAK_STEP_MB
from fedssl.reporting import stats
from fedssl.reporting.board.cells import EVALUATIONS, accuracy_of, cells, is_reference
from fedssl.reporting.board.questions import (
    BoardQuestions,
    Variance,
    line_model,
    load_questions,
)
from fedssl.reporting.formatting import markdown_table

COSTS = (CLIENT_MB_EXCHANGED.key, CLIENT_GFLOPS.key, PEAK_STEP_MB.key)  # the budget's, in order


@dataclass(frozen=True)
class Budget:
    """A client's budget over a run: MB exchanged, GFLOPs, peak step MB (None: no limit)."""

    mb: float | None = None
    gflops: float | None = None
    peak_mb: float | None = None

    def limits(self) -> dict[str, float]:
        given = (self.mb, self.gflops, self.peak_mb)
        return {k: v for k, v in zip(COSTS, given) if v is not None}


def partition_of(cell_list: list[dict], asked: str) -> str:
    """The board's partition that ``asked`` names: its label, or a part of exactly one."""
    names = list(dict.fromkeys(c["partition"] for c in cell_list))
    if asked in names:
        return asked
    found = [n for n in names if asked.lower() in n.lower()]
    if len(found) != 1:
        raise ValueError(
            f"--partition: '{asked}' names {'no' if not found else 'more than one'} partition "
            f"of the board ({'; '.join(names)})"
        )
    return found[0]


def fits(cell: dict, budget: Budget) -> bool:
    """Each budgeted cost's mean within the budget; a cost the line lacks is unknown (it does
    not fit), except for a zero-cost reference, which records none where it spends none."""
    values = cell["values"]
    missing = 0.0 if is_reference(cell) else float("inf")
    return all(
        (statistics.mean(values[key]) if key in values else missing) <= limit
        for key, limit in budget.limits().items()
    )


def _ranked(cell_list: list[dict], evaluation: str, partition: str, budget: Budget) -> list:
    mine = [
        c
        for c in cell_list
        if c["evaluation"] == evaluation and c["partition"] == partition and accuracy_of(c)
    ]
    fitting = [c for c in mine if fits(c, budget)]
    return sorted(fitting, key=lambda c: -statistics.mean(c["values"][accuracy_of(c)]))


def _line(cell: dict) -> dict:
    values = cell["values"][accuracy_of(cell)]
    ci = stats.interval(values)
    costs = {k: round(statistics.mean(cell["values"][k]), 4) for k in COSTS if k in cell["values"]}
    return {
        "method": cell["method"],
        "encoder": cell["encoder"],
        "runs": len(values),
        "mean": round(statistics.mean(values), 4),
        "ci95": ci and [round(x, 4) for x in ci],
        "reference": is_reference(cell),
    } | costs


def _against_top(ranked: list[dict], variance: Variance) -> list[dict]:
    """The top line against each other fitting line, each under ``variance``: paired, the
    two lines alone; else the model of the fitting lines of the two lines' encoders (an
    encoder's noise is its own: a ResNet's SD of 6 points would bury the small CNN's
    differences). Holm over the comparisons."""
    top, others = ranked[0], ranked[1:]
    found = []
    for other in others:
        encoders = {top["encoder"], other["encoder"]}
        pool = [c for c in ranked if c["encoder"] in encoders]
        model = line_model([top, other] if variance == "paired" else pool, variance)
        found.append(model.contrast(top["method"], other["method"]))
    adjusted = stats.holm([None if f is None else f.p for f in found])
    level = stats.ALPHA / max(len(others), 1)
    out = []
    for other, f, p in zip(others, found, adjusted):
        if f is None:
            out.append({"line": other["method"], "resolved": False, "verdict": "untested"})
            continue
        out.append(
            {"line": other["method"], "difference": round(f.difference, 4)}
            | {"p_adj": round(p, 6), "resolved": p < stats.ALPHA, "mde": round(f.mde(level), 4)}
        )
    return out


def advise(rows: list[dict], partition: str, budget: Budget, variance: Variance = "pooled") -> dict:
    """Per evaluation of the board on ``partition``: the fitting lines, best first, and the
    top line's comparisons with the others under ``variance``."""
    return _advise(cells(rows, {}), partition, budget, variance)


def _advise(cell_list: list[dict], partition: str, budget: Budget, variance: Variance) -> dict:
    partition = partition_of(cell_list, partition)
    out = {"partition": partition, "budget": budget.limits(), "variance": variance}
    out["evaluations"] = {}
    for evaluation in EVALUATIONS:
        ranked = _ranked(cell_list, evaluation, partition, budget)
        if ranked:
            compared = _against_top(ranked, variance) if len(ranked) > 1 else []
            out["evaluations"][evaluation] = {
                "lines": [_line(c) for c in ranked],
                "against_top": compared,
            }
    return out


def planned_advice(rows: list[dict], plan: BoardQuestions | None, waiting: int = 0) -> str:
    """The board page's opening: for each of the plan's typical budgets and partitions with
    runs, each evaluation's top line that fits, its interval, and the fitting lines its runs
    do not resolve from it (empty without budgets); ``waiting``: the runs of a partial board
    not made yet, which the caption says first."""
    if plan is None or not plan.advice:
        return ""
    cell_list, present = cells(rows, {}), {row["column"] for row in rows}
    made = {  # the evaluations with a line on each partition, whatever it costs
        p: list(_advise(cell_list, p, Budget(), plan.variance)["evaluations"])
        for p in plan.partitions
        if p in present
    }
    table = []
    for planned in plan.advice:
        budget = Budget(planned.mb, planned.gflops, planned.peak_mb)
        for partition, evaluations in made.items():
            found = _advise(cell_list, partition, budget, plan.variance)["evaluations"]
            table += [[planned.says, partition, *_summary(e, found.get(e))] for e in evaluations]
    header = ["budget a client", "partition", "evaluation", "top line", "95 % CI"]
    header += ["not resolved from it", "fitting lines"]
    caption = (
        f"what `fedssl advise` answers for the planned budgets (per client over the run; vs "
        f"the top: {plan.variance} t, Holm over the fitting lines; untested: one run)"
    )
    opening = f"A partial board, {waiting} runs not made yet" if waiting else "The whole board"
    caption = f"{opening}: {caption}"
    return "**Advice for typical budgets**\n\n" + markdown_table(header, table, caption) + "\n"


def _summary(evaluation: str, found: dict | None) -> list[str]:
    """One evaluation's advice as a row's cells: top line, its interval, the lines not
    resolved from it, how many fit."""
    kind = "encoders" if evaluation == "ssl" else "personalised"
    if not found:
        return [kind, "no line fits", "", "", "0"]
    top = found["lines"][0]
    ci = "[{:.1f}, {:.1f}]".format(*top["ci95"]) if top["ci95"] else "(one run)"
    against = found["against_top"]
    untested = sum(a.get("verdict") == "untested" for a in against)
    tied = [a["line"] for a in against if a.get("verdict") != "untested" and not a["resolved"]]
    words = ", ".join(tied) or "none"
    words += f"; untested: {untested}" if untested else ""
    name = top["method"] + (" (reference)" if top["reference"] else "")
    return [kind, f"{name} {top['mean']:.1f}", ci, words, str(len(found["lines"]))]


def _number(x, spec=".3g") -> str:
    return "" if x is None else format(x, spec)


def advise_text(advice: dict) -> str:
    """The advice as a reader gets it: per evaluation a ranked table and a sentence."""
    limits = ", ".join(f"{k} ≤ {v:g}" for k, v in advice["budget"].items()) or "no limit"
    parts = [
        f"Partition {advice['partition']}; budget per client over the run: {limits}; vs top: "
        f"{advice['variance']} t, Holm over the comparisons.\n"
    ]
    for evaluation, found in advice["evaluations"].items():
        vs = {a["line"]: a for a in found["against_top"]}
        rows = []
        for i, line in enumerate(found["lines"]):
            a = vs.get(line["method"])
            ci = "[{:.1f}, {:.1f}]".format(*line["ci95"]) if line["ci95"] else "(one run)"
            if a is None:
                word = "top"
            elif a.get("verdict") == "untested":
                word = "untested"
            elif a["resolved"]:
                p = "< 0.001" if a["p_adj"] < 0.001 else f"{a['p_adj']:.2g}"
                word = f"{-a['difference']:+.1f}, resolved (p {p})"
            else:
                word = f"{-a['difference']:+.1f}, not resolved (MDE {a['mde']:.1f})"
            name = line["method"] + (" (reference)" if line["reference"] else "")
            costs = [line.get(k) for k in COSTS]
            rows.append(
                [str(i + 1), name, line["encoder"], str(line["runs"])]
                + [f"{line['mean']:.1f}", ci, word.replace("-", "−")]
                + [_number(c) for c in costs]
            )
        header = ["rank", "line", "encoder", "runs", "top-1 %", "95 % CI", "vs top"]
        header += ["MB / client", "GFLOPs / client", "peak step MB"]
        tied = [a["line"] for a in found["against_top"] if not a["resolved"]]
        words = (
            f"The top line, {found['lines'][0]['method']}, is resolved from every other line."
            if not tied
            else f"Not resolved from the top line {found['lines'][0]['method']}: {', '.join(tied)}."
        )
        parts.append(
            f"**{EVALUATIONS[evaluation][0]}**\n\n{markdown_table(header, rows)}\n{words}\n"
        )
    if not advice["evaluations"]:
        parts.append("No line of the board fits this budget on this partition.\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fedssl advise", description=__doc__.split("\n\n")[0])
    ap.add_argument("--partition", required=True, help="a partition of the board (or a part)")
    ap.add_argument("--mb-per-client", type=float, help="MB a client may exchange over the run")
    ap.add_argument("--client-gflops", type=float, help="GFLOPs a client may spend over the run")
    ap.add_argument("--peak-mb", type=float, help="a client's peak step memory, MB")
    ap.add_argument("--board", default="board", help="the pipeline whose board to read")
    ap.add_argument("--json", action="store_true", help="the advice as JSON")
    args = ap.parse_args(argv)
    report = Path("results/reports") / args.board / "report.json"
    if not report.exists():
        print(f"error: --board: no committed report {report}", file=sys.stderr)
        return 1
    rows = json.loads(report.read_text())["rows"]
    budget = Budget(args.mb_per_client, args.client_gflops, args.peak_mb)
    plan = load_questions(args.board)
    try:
        advice = advise(rows, args.partition, budget, plan.variance if plan else "pooled")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(advice, indent=1, ensure_ascii=False) if args.json else advise_text(advice))
    return 0
