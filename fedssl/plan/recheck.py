"""Do the committed results still come out of the code? ``python -m fedssl.plan.recheck``
(``make recheck``) reruns a sample of each committed pipeline's stages through Snakemake, forced,
and compares the result files they rewrite with the committed ones (git's ``HEAD``).

A sample is one experiment per pipeline (its first, or ``--experiment``): every stage of that
experiment but the shared data and partition stages, so training, evaluation and costs all run
again. Numbers reproduce to the digit only on the hardware and thread count that made them
(README, "Reproducing a number"): run it where the results were made.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import statistics
import subprocess
import sys
from collections import Counter, defaultdict
from functools import cache
from pathlib import Path

from fedssl.fl.state import TIMING_FIELDS
from fedssl.plan.dag import Dag
from fedssl.plan.layout import RESULTS
from fedssl.presets import Presets
from fedssl.stage.runtime import cpu_summary

SHARED_KINDS = ("prepare_data", "partition", "report")
BAD = ("differs beyond the spread", "missing", "failed")
# Every value the committed file holds came out again, to the last digit; the new file may hold
# more (a metric or log column added since, timing columns dropped from committed logs).
SAME = "same numbers"
FIGURES = (".png", ".svg", ".pdf")


def committed_pipelines(presets: Presets) -> list[str]:
    """Pipelines with a committed report that params/pipelines.yaml still defines."""
    known = presets.pipelines().pipelines
    return sorted(
        p.parent.name for p in RESULTS.glob("reports/*/report.json") if p.parent.name in known
    )


def sample(dag: Dag, experiment: str | None = None) -> tuple[str, list[str]]:
    """The experiment to rerun and its own stages (upstream first)."""
    name = experiment or dag.experiments[0]
    if name not in dag.of_experiment:
        raise SystemExit(f"pipeline '{dag.pipeline}' has no experiment '{name}'")
    stages = [s for s in dag.of_experiment[name] if dag.stages[s].kind not in SHARED_KINDS]
    return name, list(dict.fromkeys(stages))


# ------------------------------------------------------------------ the spread
SEEDED = re.compile(r"(.*)_s(?:eed)?(\d+)$")  # bench_fedsimclr_iid_s1, smoke_lw_fedssl_seed1
TWIN = "_bf16"  # an experiment's bf16 twin of its fp32 run: smoke_fedsimclr_dir01_bf16


@cache
def spread() -> dict[tuple[str, str], float]:
    """(method, metric) -> tolerance, and ("", metric) over every method: how far a committed
    metric may move when nothing but the floats' rounding changes (another CPU, thread count or
    precision), measured on the committed results.

    Rounding differences grow through training into what a change of seed gives, so a metric's
    tolerance is the larger of 2*sqrt(2) times its median sample SD over the method's committed
    seed groups (an experiment run with seeds 0, 1, ...: the 95 % range of the difference of two
    runs with that spread) and the largest change between a committed fp32 run and its bf16
    twin."""
    metrics = {
        p.parent.name: json.loads(p.read_text())
        for p in sorted(RESULTS.glob("experiments/*/metrics.json"))
    }
    groups: dict[str, list[str]] = defaultdict(list)
    for name in metrics:
        seeded = SEEDED.fullmatch(name)
        groups[seeded[1] if seeded else name].append(name)
    sds = defaultdict(list)
    for names in groups.values():
        runs = [numbers(metrics[n]) for n in names]
        for key in set.intersection(*(set(r) for r in runs)) if len(runs) > 1 else ():
            sd = statistics.stdev(r[key] for r in runs)
            sds[method_of(names[0]), key].append(sd)
            sds["", key].append(sd)
    tolerance = {k: 2 * math.sqrt(2) * statistics.median(v) for k, v in sds.items()}
    for name, m in metrics.items():
        fp32 = numbers(metrics.get(name.removesuffix(TWIN), {})) if name.endswith(TWIN) else {}
        for key, value in numbers(m).items():
            if key in fp32:
                for k in ((method_of(name), key), ("", key)):
                    tolerance[k] = max(tolerance.get(k, 0.0), abs(value - fp32[key]))
    return tolerance


def tolerance(experiment: str, metric: str) -> float:
    """The metric's tolerance for the experiment's method (over every method where its own
    seeds give none); 0 where nothing committed measures one."""
    table = spread()
    return table.get((method_of(experiment), metric), table.get(("", metric), 0.0))


@cache
def method_of(experiment: str) -> str:
    try:
        return Presets(Path("params")).load("experiment", experiment).method.name
    except Exception:  # results of an experiment the params no longer define
        return ""


def numbers(metrics: dict) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def judge_metrics(experiment: str, old: dict, new: dict) -> tuple[str, list[str]]:
    """'same numbers' (with the metrics added), 'within the spread' or 'differs beyond the
    spread' (with the metrics past it: a committed metric the rerun no longer gives is one)."""
    if all(k in new and new[k] == v for k, v in old.items()):
        return SAME, [f"adds {k}" for k in new if k not in old]
    old_n, new_n = numbers(old), numbers(new)
    beyond = [f"{k}: {old_n[k]:g} -> absent" for k in sorted(old_n.keys() - new_n.keys())]
    for key in sorted(old_n.keys() & new_n.keys()):
        gap, tol = abs(new_n[key] - old_n[key]), tolerance(experiment, key)
        if gap > tol + 1e-9:
            beyond.append(f"{key}: {old_n[key]:g} -> {new_n[key]:g} (tolerance {tol:.3g})")
    return ("differs beyond the spread" if beyond else "within the spread"), beyond


def judge_table(old: str, new: str) -> tuple[str, list[str]]:
    """A TSV log: 'same numbers' when every committed row and column (timing columns aside)
    comes out with the same text, with the columns added; else 'differs' and where."""
    old_rows = list(csv.DictReader(io.StringIO(old), delimiter="\t"))
    new_rows = list(csv.DictReader(io.StringIO(new), delimiter="\t"))
    old_cols = [c for c in (old_rows[0] if old_rows else {}) if c not in TIMING_FIELDS]
    new_cols = list(new_rows[0]) if new_rows else []
    if len(old_rows) != len(new_rows):
        return "differs", [f"{len(old_rows)} rows -> {len(new_rows)}"]
    gone = [c for c in old_cols if c not in new_cols]
    if gone:
        return "differs", [f"column {c} gone" for c in gone]
    for i, (o, n) in enumerate(zip(old_rows, new_rows)):
        moved = [c for c in old_cols if o[c] != n[c]]
        if moved:
            return "differs", [f"row {i + 1}: {c} {o[c]} -> {n[c]}" for c in moved]
    return SAME, [f"adds column {c}" for c in new_cols if c not in old_cols]


def compare(files: list[str]) -> dict[str, str]:
    """file -> 'identical' | 'same numbers' | 'within the spread' | 'differs beyond the spread'
    | 'differs' (a log with no tolerance of its own: its experiment's metrics.json judges the
    run) | 'redrawn' (a figure: its data files are judged) | 'not committed' | 'missing', against
    git's HEAD."""
    out = {}
    for f in files:
        old = subprocess.run(["git", "show", f"HEAD:{f}"], capture_output=True)
        if old.returncode:
            out[f] = "not committed"
            continue
        if not Path(f).exists():
            out[f] = "missing"
            continue
        new = Path(f).read_bytes()
        if new == old.stdout:
            out[f] = "identical"
            continue
        if f.endswith("metrics.json"):
            old_m, new_m = json.loads(old.stdout), json.loads(new)
            out[f], lines = judge_metrics(Path(f).parent.name, old_m, new_m)
        elif f.endswith(".tsv"):
            out[f], lines = judge_table(old.stdout.decode(), new.decode())
        else:
            out[f], lines = ("redrawn" if f.endswith(FIGURES) else "differs"), []
        for line in lines:
            print(f"  {f}: {line}")
    return out


def recheck(
    pipeline: str, presets: Presets, args: argparse.Namespace, rerun: dict[str, str]
) -> dict[str, str]:
    """Rerun ``pipeline``'s sample and compare its files; ``rerun`` (stage -> the pipeline
    whose sample reran it in this invocation) spares a stage several pipelines share a second
    run: its files are compared as that run left them."""
    dag = Dag(pipeline, presets=presets)
    if args.compare_only:
        return compare([f for s in dag.stages.values() for f in s.committed])
    name, stages = sample(dag, args.experiment)
    files = [f for s in stages for f in dag.stages[s].committed]
    if all(s in rerun for s in stages):
        first = sorted({rerun[s] for s in stages})
        print(f"{pipeline}: {name}'s stages were rerun above ({', '.join(first)}); compared again")
        return {f: "not run" for f in files} if args.dry_run else compare(files)
    verb = "would rerun" if args.dry_run else "rerunning"
    print(f"{pipeline}: {verb} {name} ({', '.join(stages)})", flush=True)
    rerun.update({s: pipeline for s in stages})
    if args.dry_run:
        return {f: "not run" for f in files}
    cmd = [
        "snakemake",
        *stages,
        "--forcerun",
        *stages,
        "--cores",
        args.cores,
        "--resources",
        "gpu=1",
        "--config",
        f"pipeline={pipeline}",
        f"threads={args.threads}",
    ]
    bin_dir = Path(sys.executable).parent
    cmd[0] = str(bin_dir / "snakemake") if (bin_dir / "snakemake").exists() else "snakemake"
    if subprocess.run(cmd).returncode:
        return {f: "failed" for f in files}
    return compare(files)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fedssl recheck", description=__doc__.split("\n")[0])
    ap.add_argument("pipelines", nargs="*", help="default: every pipeline with a committed report")
    ap.add_argument("--experiment", help="rerun this experiment (default: each pipeline's first)")
    ap.add_argument("--cores", default="all")
    ap.add_argument("--threads", type=int, default=1, help="per stage (default: one, as committed)")
    ap.add_argument("-n", "--dry-run", action="store_true", help="say what would rerun")
    ap.add_argument(
        "--compare-only", action="store_true", help="rerun nothing: judge the files as they are"
    )
    args = ap.parse_args(argv)
    presets = Presets(Path("params"))
    results, rerun = {}, {}
    for pipeline in args.pipelines or committed_pipelines(presets):
        results.update(recheck(pipeline, presets, args, rerun))
    if args.dry_run:
        for f in results:
            print(f"would compare  {f}")
        print(f"dry run: nothing ran, nothing compared ({len(results)} committed files would be)")
        return 0
    for f, status in results.items():
        print(f"{status:>25}  {f}")
    counts = ", ".join(f"{n} {s}" for s, n in Counter(results.values()).most_common())
    print(f"{len(results)} committed files: {counts}; this machine: {cpu_summary()}")
    bad = [f for f, s in results.items() if s in BAD]
    if any(s == SAME for s in results.values()):
        print(f"{SAME}: every committed value came out again; the new file adds what is listed")
    if any(s == "within the spread" for s in results.values()):
        print("within the spread: every metric moved less than its tolerance (README, Reproducing)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
