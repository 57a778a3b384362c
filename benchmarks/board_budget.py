"""Measure what the benchmark board's budget rule needs, on a tiny run: for each method
preset of the board (``params/experiments/bench_*.yaml``, seed 0, Dirichlet 0.1), run all its
stages once at one unit of its rounds setting, on a tenth of the clients' data (600 images)
and 500 probe-training images, in a scratch copy of the project's params (its own
``artifacts/``), and record each stage's CPU seconds (one thread).

Extrapolation to the board (stated in the README): the steps that run the rounds and the
method's other steps, and fine-tuning, scale with the images (x 10); the probes (features of
the full test split, linear / k-NN, costs, personalised evaluation) are taken as measured; on
the board's 2-core CPU the wall time is the CPU seconds / 2 (two threads per training stage,
or two light stages at once), plus, for each stage, the CPU seconds a stage's process takes
to start (Python, torch; measured once, counted in full). CPU seconds, not wall, because
the machine that measures may be shared. Writes ``benchmarks/board_budget.tsv`` (``python -m
fedssl.reporting.board budget`` applies the rule to it), replacing the lines of the presets it
measured.

    python benchmarks/board_budget.py [PRESET ...]      # default: every line

Not a test."""

from __future__ import annotations

import csv
import fnmatch
import importlib
import os
import resource
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedssl.reporting.board.budget import BUDGET_FILE, budget_lines  # noqa: E402

BUDGET_FILE = BUDGET_FILE.resolve()

# preset -> (its rounds setting, the steps that run those rounds, the board's runs of it),
# derived from the presets and the method registry
LINES = budget_lines()
# presets measured at, and never run below, more than one unit of their rounds (CP-CFL explores
# for 2 rounds before its clusters train)
UNITS = {
    "bench_cpcfl": 3,
}
HEADER = ["preset", "rounds_key", "round_steps", "runs", "least_rounds", "round_s", "fixed_s"]
HEADER += ["measured_cpu_s"]
SCALE = 10  # the board's 6,000 client images / the 600 measured
CORES = 2
AS_MEASURED = {"features", "evaluate", "costs", "personal"}  # do not grow with the images
REPO = Path(__file__).resolve().parents[1]


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def stage_start_seconds() -> float:
    """CPU seconds a stage's process spends starting (Python, torch, the stage code): every
    stage of the board pays it once; the stages measured here run in one warm process."""
    import subprocess

    before = cpu_seconds(resource.RUSAGE_CHILDREN)
    code = "import torch, fedssl.stage.context, fedssl.fl, stages.method"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    return cpu_seconds(resource.RUSAGE_CHILDREN) - before


def scratch_params(folder: Path, preset: str, rounds_key: str, units: int) -> str:
    """A copy of params/ in ``folder`` with the tiny partition and a preset ``measure`` that
    runs ``preset`` for one unit of its rounds."""
    shutil.copytree(REPO / "params", folder / "params")
    part = folder / "params" / "partitions" / "bench_fmnist_dir01_m10.yaml"
    part.write_text(part.read_text().replace("subset: 6000", f"subset: {6000 // SCALE}"))
    text = (folder / "params" / "experiments" / f"{preset}.yaml").read_text()
    tiny: dict = {"extends": preset}
    if "features:" in text:  # probed methods: a tenth of the probe's training images
        tiny["features"] = {"train_size": 500}
    node = tiny
    *parents, leaf = rounds_key.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = units
    if "finetune:" in text:
        tiny["finetune"] = {"train_size": 600 // SCALE}
    (folder / "params" / "experiments" / "measure.yaml").write_text(yaml.safe_dump(tiny))
    return "measure"


def measure(preset: str, start_s: float) -> dict:
    """Run every stage of a tiny ``preset`` (upstream first) and extrapolate its CPU seconds;
    each of its stages also pays ``start_s`` (one thread: wall = CPU)."""
    rounds_key, round_steps, runs = LINES[preset]
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            units = UNITS.get(preset, 1)
            name = scratch_params(Path(tmp), preset, rounds_key, units)
            from fedssl.plan.dag import Dag

            dag = Dag(None, experiments=[name])
            mine = set(dag.of_experiment[name])
            round_s = fixed_s = measured = 0.0
            for stage_name, stage in dag.stages.items():
                _, _, module, *args = stage.cmd.split()
                start = cpu_seconds()
                importlib.import_module(module).run(args)
                spent = cpu_seconds() - start
                if stage_name not in mine:  # data set, partition: shared by the whole board
                    continue
                measured += spent
                fixed_s += start_s
                if fnmatch.fnmatch(stage.kind, round_steps):
                    round_s += spent * SCALE / CORES / units
                else:
                    fixed_s += spent * (1 if stage.kind in AS_MEASURED else SCALE) / CORES
        finally:
            os.chdir(cwd)
    return {
        "preset": preset,
        "rounds_key": rounds_key,
        "round_steps": round_steps,
        "runs": runs,
        "least_rounds": UNITS.get(preset, 1),
        "round_s": round(round_s, 2),
        "fixed_s": round(fixed_s, 2),
        "measured_cpu_s": round(measured, 1),
    }


def torch_threads() -> None:
    os.environ["FEDSSL_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("FEDSSL_DEVICE", "cpu")


def main(argv: list[str]) -> int:
    torch_threads()
    start_s = stage_start_seconds()
    import torch  # noqa: F401  (paid above, once per stage: not in a stage's own seconds)

    old = {}
    if BUDGET_FILE.exists():
        old = {r["preset"]: r for r in csv.DictReader(open(BUDGET_FILE), delimiter="\t")}
    for preset in argv or list(LINES):
        old[preset] = measure(preset, start_s)
        print("\t".join(str(old[preset][h]) for h in HEADER), flush=True)
        with open(BUDGET_FILE, "w", newline="") as f:  # after each: a partial table is kept
            w = csv.DictWriter(f, HEADER, delimiter="\t", lineterminator="\n")
            w.writeheader()
            w.writerows(old[p] for p in LINES if p in old)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
