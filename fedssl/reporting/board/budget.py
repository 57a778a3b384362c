"""The wall-time budget that sets each method's rounds on a board (:func:`rounds_within`),
the table of per-round times it was applied to, and the second board's plan of parts."""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
from pathlib import Path

from fedssl.reporting.formatting import markdown_table, number


def rounds_within(budget_s: float, fixed_s: float, round_s: float, least: int = 1) -> int:
    """The rounds of a run that gets ``budget_s`` seconds: what is left after its fixed work
    (probes, export, server steps: ``fixed_s``) divided by the seconds of one round, at least
    ``least`` rounds (one, or what the method needs to be itself)."""
    if round_s <= 0:
        raise ValueError(f"round_s: a round takes a positive time, got {round_s}")
    return max(least, math.floor((budget_s - fixed_s) / round_s))


def per_run_budget(total_s: float, shared_s: float, runs: int) -> float:
    """The rule: every run of the board gets the same wall time, the total less the shared
    upstream work (data, partitions) divided by the number of runs."""
    if runs < 1:
        raise ValueError(f"runs: expected at least one run, got {runs}")
    return (total_s - shared_s) / runs


BUDGET_FILE = Path("benchmarks/board_budget.tsv")


BUDGET_PIPELINE = "benchmark"  # the first board, whose presets the budget measures


def budget_lines(pipeline: str = BUDGET_PIPELINE, presets=None) -> dict[str, tuple[str, str, int]]:
    """The budget's line table, derived from the presets and the method registry: for each
    preset the pipeline's experiments extend (a grid's ``extends``, or the experiment
    itself) and that federates, its rounds setting (the federation block's ``rounds``), the
    steps that run those rounds (a glob: ``grow_*`` for a growing encoder's stages) and the
    pipeline's runs of it."""
    if presets is None:
        from fedssl.presets import Presets

        presets = Presets()
    members, grids = presets.grid_members("experiment"), presets.grids().experiments
    runs: dict[str, int] = {}
    for e in presets.pipeline_experiments(pipeline):
        grid = members.get(e, (e, {}))[0]
        base = grids[grid].extends if grid in grids else e
        runs[base] = runs.get(base, 0) + 1
    out = {}
    for preset, n in runs.items():
        entry = line_entry(presets.load("experiment", preset).method)
        if entry is not None:
            out[preset] = (*entry, n)
    return out


def line_entry(method_params) -> tuple[str, str] | None:
    """A method's rounds setting and the glob of its round steps; None: no federation."""
    from fedssl.methods import registry
    from fedssl.methods.base import federation_path

    path = federation_path(type(method_params))
    if path is None:
        return None
    steps = registry.get(method_params.name).round_steps(method_params)
    glob = steps[0] if len(steps) == 1 else os.path.commonprefix(steps) + "*"
    return f"{path}.rounds", glob


BUDGET_TOTAL_S = 3 * 3600  # the board on a 2-core CPU


BUDGET_SHARED_S = 60  # data set and the three partitions


def budget_table(path: Path = BUDGET_FILE) -> list[dict]:
    """The measured table (a line per method: runs in the board, seconds per round and fixed
    seconds per run) with the rule's rounds and the estimated wall time of its runs."""
    lines = list(csv.DictReader(open(path), delimiter="\t"))
    runs = sum(int(line["runs"]) for line in lines)
    budget = per_run_budget(BUDGET_TOTAL_S, BUDGET_SHARED_S, runs)
    for line in lines:
        r, f = float(line["round_s"]), float(line["fixed_s"])
        line["rounds"] = rounds_within(budget, f, r, int(line.get("least_rounds") or 1))
        line["estimate_s"] = round(int(line["runs"]) * (f + line["rounds"] * r))
    return lines


def budget_markdown(lines: list[dict]) -> str:
    """The budget table as the docs show it, with the board's estimated total."""
    rows = [
        [x["preset"], x["rounds_key"], str(x["runs"]), x["round_s"], x["fixed_s"]]
        + [str(x["rounds"]), number(x["estimate_s"] / 60, ".1f")]
        for x in lines
    ]
    total = sum(x["estimate_s"] for x in lines) / 3600
    header = ["preset", "rounds setting", "runs", "s / round", "fixed s / run", "rounds"]
    caption = (
        f"The budget rule on {BUDGET_FILE} (estimated wall seconds on the 2-core CPU): "
        f"estimated board total {total:.2f} h"
    )
    return markdown_table(header + ["estimate min"], rows, caption)


# Rounds set per family, not by one wall budget: the plan (a line per grid of the `board`
# pipeline, or per variant of a grid) names the first board's line whose measured wall times
# it takes (its committed per-stage times, results/runs/benchmark.tsv), its rounds and runs,
# a factor on the round's time where its local schedule differs (MpFedcon's paper regime:
# 11 local epochs where the first board ran 3) and its k-NN monitor evaluations.
PLAN_FILE = Path("benchmarks/board_plan.tsv")


MEASURED_FILE = Path("results/runs/benchmark.tsv")


MEASURED_REPORT = Path("results/reports/benchmark/report.json")


def round_step_names(pipeline: str = BUDGET_PIPELINE) -> set[str]:
    """The stage kinds that run a federation's rounds in the pipeline's experiments (the
    steps that read the federation block, by the registry)."""
    from fedssl.methods import registry
    from fedssl.presets import Presets

    presets = Presets()
    names: set[str] = set()
    for e in presets.pipeline_experiments(pipeline):
        method = presets.load("experiment", e).method
        names.update(registry.get(method.name).round_steps(method))
    return names


MONITOR_CALL_S = 2.0  # one k-NN monitor evaluation on the small CNN (bank 5,000, queries 2,000)


STAGES_AT_ONCE = 2  # the 2-core CPU runs two one-thread stages at a time


# the grid axes that set a run's partition and seed (params/grids.yaml), not its method
RUN_AXES = ("bench_part", "bench_seed", "board_run", "board_skew_run", "board_run_mfcl",
            "board_skew_run_cpcfl", "b2_run", "b2_run5", "b2_m100")  # fmt: skip


def line_of(experiment: str, members: dict) -> str:
    """A board experiment's line in the plan: its grid, with the labels of its axes other
    than the partition and seed (``bench_personal:fedrep``)."""
    grid, labels = members.get(experiment, (experiment, {}))
    variant = [v for k, v in labels.items() if k not in RUN_AXES]
    return ":".join([grid, *variant]) if variant else grid


def measured_times(
    runs_file: Path = MEASURED_FILE, report: Path = MEASURED_REPORT, members: dict | None = None
) -> dict[str, dict]:
    """Per line of the first board: its runs' mean wall seconds per round (its round steps'
    wall over its rounds) and of its other stages (probes, costs, export, server steps), from
    the committed per-stage times (each stage counted with the experiment that owns it)."""
    if members is None:
        from fedssl.presets import Presets

        members = Presets().grid_members("experiment")
    rounds = {r["experiment"]: r["rounds"] for r in json.loads(report.read_text())["rows"]}
    round_steps = round_step_names()
    lines: dict[str, dict] = {}
    with open(runs_file) as f:
        for r in csv.DictReader((x for x in f if not x.startswith("#")), delimiter="\t"):
            line = lines.setdefault(line_of(r["experiment"], members), {"round": {}, "fixed": {}})
            kind = "round" if r["stage"] in round_steps else "fixed"
            line[kind][r["experiment"]] = line[kind].get(r["experiment"], 0.0) + float(
                r["wall_seconds"]
            )
    out = {}
    for name, line in lines.items():
        runs = set(line["round"]) | set(line["fixed"])
        per_round = [line["round"][e] / rounds[e] for e in line["round"] if rounds.get(e)]
        out[name] = {
            "round_s": round(statistics.mean(per_round), 2) if per_round else 0.0,
            "fixed_s": round(sum(line["fixed"].values()) / len(runs), 2),
        }
    return out


def plan_table(path: Path = PLAN_FILE, measured: dict | None = None) -> list[dict]:
    """The plan's lines with their estimated wall seconds on the 2-core CPU (one thread):
    runs x (rounds x the measured round x its factor + the measured fixed seconds + the
    monitor's evaluations)."""
    measured = measured_times() if measured is None else measured
    lines = list(csv.DictReader(open(path), delimiter="\t"))
    for line in lines:
        if line["measured_as"] not in measured:
            raise KeyError(
                f"{path}: measured_as '{line['measured_as']}' is no line of {MEASURED_FILE}"
            )
        m = measured[line["measured_as"]]
        run_s = int(line["rounds"]) * m["round_s"] * float(line["round_scale"]) + m["fixed_s"]
        run_s += int(line["monitor_calls"]) * MONITOR_CALL_S
        line.update(round_s=m["round_s"], fixed_s=m["fixed_s"], run_s=round(run_s, 1))
        line["estimate_s"] = round(int(line["runs"]) * run_s)
    return lines


def plan_markdown(lines: list[dict]) -> str:
    """The plan as the README shows it: a line per grid (or variant), then the hours of each
    part (two stages at a time on the 2-core CPU) and of the whole board."""
    rows = [
        [x["part"], x["grid"], x["rounds"], x["runs"], number(x["round_s"], "g")]
        + [number(x["fixed_s"], "g"), x["round_scale"], number(x["run_s"] / 60, ".1f")]
        for x in lines
    ]
    header = ["part", "line", "rounds", "runs", "s / round", "fixed s", "round x", "min / run"]
    parts: dict[str, float] = {}
    for x in lines:
        parts[x["part"]] = parts.get(x["part"], 0.0) + x["estimate_s"] / STAGES_AT_ONCE / 3600
    hours = ", ".join(f"{p} {h:.2f} h" for p, h in parts.items())
    caption = (
        f"The second board's plan ({PLAN_FILE}): per-round and fixed wall seconds of each line "
        f"as the first board measured them ({MEASURED_FILE}; one thread, two stages at a time), "
        f"the k-NN monitor at {MONITOR_CALL_S:g} s an evaluation; estimated wall hours of the "
        f"2-core CPU per part: {hours}; in all {sum(parts.values()):.2f} h"
    )
    return markdown_table(header, rows, caption)
