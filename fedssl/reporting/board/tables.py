"""The board's tables: one per evaluation, a line per method, encoder and partition, mean ± SD
over seeds with the costs beside, the caption saying the machine and the SD convention."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from fedssl.reporting import stats
from fedssl.reporting.board.cells import EVALUATIONS, SD, accuracy_of, cost_columns, runs_text
from fedssl.reporting.board.flags import MARK, flag_marks, flag_notes
from fedssl.reporting.board.significance import significance_text, verdict_text
from fedssl.reporting.board.simulate import PROFILES, SERVER_GFLOPS_PER_S
from fedssl.reporting.board.tuning import HEADER as TUNING_HEADER
from fedssl.reporting.formatting import markdown_table, mean_sd, number, sd_note


def hardware(records: Iterable[dict]) -> str:
    """The machines the runs' stages recorded, as a caption's words."""
    seen = []
    for r in records:
        env = r.get("environment", {})
        words = env.get("gpu") or f"{env.get('cpu_count', '?')}-core CPU"
        threads = env.get("FEDSSL_THREADS") or env.get("torch_threads")
        words += f", torch threads {threads}" if threads and not env.get("gpu") else ""
        words = f"{env.get('host', '?')} ({words}, torch {env.get('torch', '?')})"
        if words not in seen:
            seen.append(words)
    return "; ".join(seen) or "no run records"


def _interval_text(values: list[float]) -> str:
    ci = stats.interval(values)
    return f"[{ci[0]:.1f}, {ci[1]:.1f}]" if ci else ""


def _target_text(cell: dict) -> list[str]:
    t = cell.get("to_target")
    if not t:
        return ["", ""]
    if t["rounds"] is None:
        return [f"not reached ({t['reached']}/{t['of']})", ""]
    return [f"{t['rounds']:g}", number(t["MB"], ".3g")]


def _cost_text(values: dict, column: str) -> str:
    """A cost column's mean over the line's runs (blank where its runs have none)."""
    return number(statistics.mean(values[column]), ".4g") if column in values else ""


def _table_row(cell: dict, shown: list[str], costs: list[str], extra: dict, notes: dict):
    """A table's line of one method, encoder and partition (see :func:`table`); ``extra``:
    whether the table has the tuning and the to-target columns."""
    v, first = cell["values"], accuracy_of(cell)
    return (
        [cell["method"], cell["encoder"], cell["partition"], runs_text(cell)]
        + ([cell.get("tuning", "")] if extra["tuning"] else [])
        + [mean_sd(v.get(shown[0], []), SD, ".1f") + flag_marks(cell, shown[0], notes)]
        + [_interval_text(v.get(first, []))]
        + [verdict_text(cell.get("vs_best")), verdict_text(cell.get("vs_reference"))]
        + [mean_sd(v.get(c, []), SD, ".1f") + flag_marks(cell, c, notes) for c in shown[1:]]
        + [_cost_text(v, c) + flag_marks(cell, c, notes) for c in costs]
        + (_target_text(cell) if extra["targets"] else [])
    )


def _profiles() -> str:
    """The simulated profiles in words: the FLOPs at the client's rate, bytes over its link."""
    return "; ".join(f"{name}: {p.words}" for name, p in PROFILES.items())


def _table_caption(evaluation: str, heading: str, mine: list[dict], machine: str) -> str:
    """What a table's columns mean (see :func:`table`)."""
    last = sorted({k for c in mine for k in c["last_rounds"]})
    words = ""
    if any("tuning" in c for c in mine):
        words += (
            f"; {TUNING_HEADER}: the runs' learning rate, tuned where it is the best of half, one "
            "and twice the line's starting rate, each run once on the 10-client ξ = 0.1 draw 0 "
            "and scored on its validation split (training images no client holds; "
            "tuning.md), untuned otherwise"
        )
    if evaluation == "personal" and last:
        k = "/".join(map(str, last))
        words += f"; personal = the clients' mean accuracy averaged over the last {k} rounds"
    return (
        f"{heading}: {sd_note(SD, 'seeds')} (n = the runs column) and its 95 % interval "
        f"(Student's t){words}; vs best (a screening): the difference in points from the "
        "partition's best trained line, paired by seed (95 % interval), p adjusted for a "
        "false-discovery rate of 5 % (Benjamini-Hochberg), references left out; vs reference: "
        "from the line of the same encoder that exchanges nothing (the untrained network; "
        "SOLO): the planned question's answer where the pipeline plans one (its family's "
        "variance, Holm within its family, the MDE beside 'not separable'), else paired by "
        "seed with Holm over the partition; 'not separable' at p ≥ 0.05; MB sent + "
        "received: every byte the ledger counted, one-shot transfers included; encoder MB: "
        "the encoder's parameters alone (the heads trained on top left out), where the "
        "ledger tells them apart (blank where it counts one network); costs are means "
        "per client and run (blank: the method has no costs stage); total GFLOPs: the "
        "client's plus the server's on its behalf where its costs stage counts them (split "
        f"learning); s / round (sim.): {_profiles()}, server {SERVER_GFLOPS_PER_S:g} GFLOP/s, "
        "no latency (the measured wall time, contended, is in board.json); the runs' "
        f"hardware: {machine}"
        + (
            f"; {MARK}n: a flag, its note under the table"
            if any(c.get("flags") for c in mine)
            else ""
        )
    )


def table(evaluation: str, cell_list: list[dict], machine: str, notes: dict | None = None) -> str:
    """One evaluation's table: a line per method, encoder and partition; its accuracy as
    mean ± SD over seeds with its 95 % interval and its comparisons (with the best line of
    its partition, with its reference), its other accuracies, then the costs as means and,
    where its runs log accuracy per round, the rounds and MB to the target. A flagged cell
    carries its marks, numbered in ``notes`` (:func:`flag_marks`)."""
    notes = {} if notes is None else notes
    heading, accuracies = EVALUATIONS[evaluation]
    mine = [c for c in cell_list if c["evaluation"] == evaluation]
    shown = [c for c in accuracies if any(c in cell["values"] for cell in mine)]
    headers = cost_columns()
    costs = [c for c in headers if any(c in cell["values"] for cell in mine)]
    extra = {k: any(c.get(k) for c in mine) for k in ("tuning", "to_target")}
    extra["targets"] = extra.pop("to_target")
    lines = [_table_row(cell, shown, costs, extra, notes) for cell in mine]
    header = ["method", "encoder", "partition", "runs"] + [TUNING_HEADER] * extra["tuning"]
    header += [accuracies[shown[0]], "95 % CI"]
    header += ["vs best (screening)", "vs reference"] + [accuracies[c] for c in shown[1:]]
    header += [headers[c] for c in costs] + (
        ["rounds to target", "MB to target"] if extra["targets"] else []
    )
    return markdown_table(header, lines, _table_caption(evaluation, heading, mine, machine))


def tables_text(
    cell_list: list[dict],
    machine: str,
    total_wall: float,
    pending: list[str] = (),
    failed: list[dict] = (),
    links: str = "",
) -> str:
    """The board's tables, what is significant, and its total wall time
    (``board_tables.md``, which the docs' block copies); a board made part by part says
    how many runs are still to come, and a run that stopped with an error (a diverged loss)
    is named with it: its line's mean leaves it out, and its runs column says how many
    stopped (its failure rate). Under a
    table, its flags' notes (``links``: :func:`flag_notes`)."""
    parts = []
    if pending:
        parts.append(f"*Partial board: {len(pending)} runs not made yet (named in report.md).*\n")
    if failed:
        named = "; ".join(f"`{f['experiment']}` ({f['stage']}: {f['error']})" for f in failed)
        parts.append(
            f"*{len(failed)} run(s) stopped with an error and are left out of their lines' "
            f"numbers (the runs column counts them apart, '+k failed'): {named}.*\n"
        )
    notes: dict[tuple, dict] = {}
    for evaluation, (heading, _) in EVALUATIONS.items():
        if any(c["evaluation"] == evaluation for c in cell_list):
            before = {k: len(v["lines"]) for k, v in notes.items()}
            text = table(evaluation, cell_list, machine, notes)
            mine = {  # the notes of this table, with its lines alone
                k: {"n": v["n"], "lines": v["lines"][before.get(k, 0) :]}
                for k, v in notes.items()
                if len(v["lines"]) > before.get(k, 0)
            }
            flagged = f"\n*Flags:*\n\n{flag_notes(mine, links)}" if mine else ""
            parts.append(f"**{heading}**\n\n{text}\n{flagged}")
    parts.append(significance_text(cell_list))
    return (
        "\n".join(p for p in parts if p)
        + f"\nTotal wall time of the pipeline's stages: {total_wall / 3600:.2f} h.\n"
    )


FIGURES = {
    "board_accuracy_vs_MB.png": "accuracy against every byte a client exchanged",
    "board_accuracy_vs_GFLOPs.png": "accuracy against total GFLOPs (client + server's)",
    "board_over_run_encoders.png": "self-supervised and supervised encoders over the run "
    "(k-NN monitor against rounds, wall time, MB, GFLOPs)",
    "board_over_run_personalised.png": "personalised methods over the run (the clients' mean "
    "accuracy against rounds, wall time, MB, GFLOPs)",
    "curves.png": "per-round curves of every run (the report's)",
}


def render(pipeline: str, tables: str, figures: Iterable[str] = FIGURES) -> str:
    """board.md's text: the tables and the figures."""
    shown = "".join(f"![{FIGURES[f]}]({f})\n" for f in FIGURES if f in figures)
    return f"# Benchmark board: pipeline `{pipeline}`\n\n{tables}\n{shown}"
