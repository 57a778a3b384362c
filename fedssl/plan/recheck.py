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
import subprocess
import sys
from pathlib import Path

from fedssl.plan.dag import Dag
from fedssl.plan.layout import RESULTS
from fedssl.presets import Presets

SHARED_KINDS = ("prepare_data", "partition", "report")


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


def compare(files: list[str]) -> dict[str, str]:
    """file -> 'same' | 'differs' | 'not committed' | 'missing', against git's HEAD."""
    out = {}
    for f in files:
        old = subprocess.run(["git", "show", f"HEAD:{f}"], capture_output=True)
        if old.returncode:
            out[f] = "not committed"
        elif not Path(f).exists():
            out[f] = "missing"
        else:
            out[f] = "same" if Path(f).read_bytes() == old.stdout else "differs"
    return out


def recheck(
    pipeline: str, presets: Presets, experiment: str | None, cores: str, dry_run: bool
) -> dict[str, str]:
    dag = Dag(pipeline, presets=presets)
    name, stages = sample(dag, experiment)
    files = [f for s in stages for f in dag.stages[s].committed]
    verb = "would rerun" if dry_run else "rerunning"
    print(f"{pipeline}: {verb} {name} ({', '.join(stages)})", flush=True)
    if dry_run:
        return {f: "not run" for f in files}
    cmd = [
        "snakemake",
        *stages,
        "--forcerun",
        *stages,
        "--cores",
        cores,
        "--resources",
        "gpu=1",
        "--config",
        f"pipeline={pipeline}",
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
    ap.add_argument("-n", "--dry-run", action="store_true", help="say what would rerun")
    args = ap.parse_args(argv)
    presets = Presets(Path("params"))
    results = {}
    for pipeline in args.pipelines or committed_pipelines(presets):
        results.update(recheck(pipeline, presets, args.experiment, args.cores, args.dry_run))
    if args.dry_run:
        for f in results:
            print(f"would compare  {f}")
        print(f"dry run: nothing ran, nothing compared ({len(results)} committed files would be)")
        return 0
    for f, status in results.items():
        print(f"{status:>13}  {f}")
    bad = [f for f, s in results.items() if s in ("differs", "missing", "failed")]
    print(
        f"{len(results) - len(bad)} of {len(results)} committed files reproduced"
        + (f"; {len(bad)} did not" if bad else "")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
