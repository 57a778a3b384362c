"""A dress rehearsal of the paper pipelines: each ``paper_*`` pipeline of params/pipelines.yaml
runs end to end on tiny data sets written in their real on-disk formats (tests/formats.py),
with the paper's architectures and resolutions but one round or epoch per stage, a few
clients and a handful of images.

How: :func:`build` writes a throw-away project (a copy of the code, its own ``params/``, its own
``artifacts/`` and ``results/``, the fixtures under ``data/``), so nothing of the checkout is
read or written past its code and params. Its params are the checkout's presets *resolved*
(``extends`` chains and grid members flattened into one file each) with :data:`OVERLAY` applied
by key name to every experiment and partition, and its pipelines.yaml names only the chosen
experiments. The overlay caps sizes and never touches architectures or resolutions.

Which experiments: one per *stage shape* (:func:`shape`), the last of each in the pipeline's
order, unless ``every=True``. ``python -m tests.rehearsal [PIPELINE ...] [--all]`` runs
pipelines through Snakemake in one project and prints what each one added in wall time
(``make rehearse`` runs the pytest marker ``rehearsal``, a project per pipeline).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import yaml

from tests.fixtures import REPO, copy_code, run_stages_in_process
from tests.formats import (
    write_cifar10,
    write_cifar100,
    write_femnist,
    write_random_fashion_mnist,
    write_random_tiny_imagenet,
    write_stl10,
)

# Key name -> the most a rehearsal keeps (whatever the section): counts of rounds, epochs,
# steps, clients and samples. A key ending in ``_epochs`` is capped as ``epochs``.
OVERLAY = {
    # one round or epoch of everything, no warm-up
    "rounds": 1,
    "warmup_rounds": 1,
    "explore_rounds": 1,
    "last_rounds": 1,
    "epochs": 1,
    "warmup_epochs": 0,
    # a few clients (a multiple of 2 and 3: class groups and shards split them evenly)
    "num_clients": 6,
    "min_per_client": 2,
    "major_count": 2,
    "minor_count": 1,
    "per_client": 4,
    "server_holdout": 8,
    "lognormal_mean": 1.0,
    "size_offset": 10.0,  # a tenth of every party is its test set: one image at least
    # small batches, queues, banks and samples
    "batch_size": 8,
    "batch_pairs": 8,
    "queue_size": 32,
    "memory_size": 32,
    "bank_size": 32,
    "k": 5,  # k-NN neighbours: no more than the fixture's bank
    "query_size": 16,
    "size": 32,
    "train_size": 32,
    "test_size": 16,
    "relevance_samples": 16,
    "label_images": 8,
    "eval_images": 8,
    "recon_images": 2,
    "recon_label_images": 4,
    "show": 2,
    "global_clusters": 8,
    "local_clusters": 4,
    # steps of the attacks and syncs
    "iterations": 2,
    "lbfgs_max_iter": 2,
    "dlg_label_iterations": 2,
    "sync_every": 2,
}
PHASES = ("warmup_rounds", "explore_rounds")  # rounds spent before a method's main phase
DROPPED = ("subset",)  # a partition splits the whole fixture


def capped(key: str, value):
    """``value`` under the overlay's cap for ``key`` (numbers only; None and bools stay)."""
    cap = OVERLAY.get(key, OVERLAY["epochs"] if key.endswith("_epochs") else None)
    if cap is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return min(value, cap)


def overlay(tree):
    """A params tree with :data:`OVERLAY` applied to every key at any depth. A section's
    ``rounds`` keep one round per phase: one, plus its phases' (capped) rounds."""
    if isinstance(tree, list):
        return [overlay(v) for v in tree]
    if not isinstance(tree, dict):
        return tree
    out = {
        k: None if k in DROPPED else overlay(v) if isinstance(v, (dict, list)) else capped(k, v)
        for k, v in tree.items()
    }
    if isinstance(out.get("rounds"), int):
        phases = sum(out.get(k) or 0 for k in PHASES)
        out["rounds"] = min(tree["rounds"], OVERLAY["rounds"] + phases)
    return out


# Each data set's rehearsal fixture with about ``n`` training images (enough for six clients of
# two classes, or twenty of CIFAR-100's), two test images per class (a client's test set may
# copy its training class mix) and every split the readers read.
FIXTURES = {
    "fashion_mnist": lambda root, n: write_random_fashion_mnist(root, n, 20),
    "cifar10": lambda root, n: write_cifar10(root, n, 20),
    "cifar100": lambda root, n: write_cifar100(root, max(2 * n, 120), 200),
    "stl10": lambda root, n: write_stl10(root, n, 20, max(n // 3, 8)),
    "tiny_imagenet": lambda root, n: write_random_tiny_imagenet(root, 10, max(n // 10, 2), 2),
    "femnist": lambda root, n: write_femnist(root, writers=4, per_writer=max(n // 4, 21)),
}
IMAGES = 24  # training images per data set: four per client


ARCH_KEYS = ("arch", "base")  # what names a network's architecture in method params


def _values_of(tree, keys: tuple[str, ...]) -> list[str]:
    if isinstance(tree, dict):
        found = [f"{k}={v}" for k, v in tree.items() if k in keys and isinstance(v, str)]
        return found + [x for v in tree.values() for x in _values_of(v, keys)]
    if isinstance(tree, list):
        return [x for v in tree for x in _values_of(v, keys)]
    return []


def shape(presets, experiment: str) -> tuple:
    """Method × data set × architecture, and the stages that run: the method's name, the data
    set, every ``arch`` or ``base`` in the method's params (a method without one has its own
    network), the method's steps and the evaluations the experiment has."""
    from fedssl.methods import registry

    exp = presets.load("experiment", experiment)
    dataset = presets.load("dataset", presets.load("partition", exp.partition).dataset).name
    steps = [s.name for s in registry.get(exp.method.name).steps_for(exp.method)]
    evaluations = [k for k, v in exp.model_dump().items() if k != "method" and isinstance(v, dict)]
    arch = sorted(set(_values_of(exp.method.model_dump(mode="json"), ARCH_KEYS)))
    return (exp.method.name, dataset, *arch, *steps, *evaluations)


def representatives(presets, pipeline: str, every: bool = False) -> list[str]:
    """One experiment per :func:`shape` of ``pipeline`` (all of them with ``every``): the last
    of each, since a paper's pipeline lists its baselines before the method it is about."""
    chosen: dict[tuple, str] = {}
    for name in presets.pipeline_experiments(pipeline):
        chosen[(name,) if every else shape(presets, name)] = name
    return list(dict.fromkeys(chosen.values()))


def paper_pipelines(presets) -> list[str]:
    return [p for p in presets.pipelines().pipelines if p.startswith("paper_")]


def _write_yaml(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def choose(presets, pipelines: list[str], every: bool = False) -> dict[str, list[str]]:
    """Each pipeline's experiments to rehearse (:func:`representatives`)."""
    return {p: representatives(presets, p, every) for p in pipelines}


def build(root: Path, chosen: dict[str, list[str]], images: int = IMAGES) -> None:
    """The rehearsal project at ``root`` for pipelines -> their experiments to rehearse (the
    first pipeline is also its ``default``), with fixtures of about ``images`` images."""
    from fedssl.presets import Presets, read_yaml

    presets = Presets(REPO / "params")
    copy_code(root)
    experiments = list(dict.fromkeys(e for names in chosen.values() for e in names))
    partitions = {presets.load("experiment", e).partition for e in experiments}
    datasets = {presets.load("partition", p).dataset for p in partitions}
    params = root / "params"
    for name in sorted(datasets):
        kind = presets.load("dataset", name).name
        folder = root / "data" / name
        FIXTURES[kind](folder, images)
        _write_yaml(
            params / "datasets" / f"{name}.yaml",
            {"name": kind, "data_root": str(folder), "download": False},
        )
    for kind, names in (("partition", partitions), ("experiment", experiments)):
        for name in sorted(names):
            merged = overlay(presets.resolve(kind, name).merged)
            _write_yaml(params / f"{kind}s" / f"{name}.yaml", merged)
    specs = read_yaml(REPO / "params" / "pipelines.yaml")["pipelines"]
    out = {"default": next(iter(chosen.values()))}
    for p, names in chosen.items():
        out[p] = {**specs[p], "experiments": names} if isinstance(specs[p], dict) else names
    _write_yaml(params / "pipelines.yaml", {"pipelines": out})


def environment(root: Path) -> dict[str, str]:
    """The rehearsal project's code first on the path (not the checkout's editable install)."""
    return {**os.environ, "PYTHONPATH": str(root)}


def snakemake(root: Path, pipeline: str, cores: int | str = "all") -> subprocess.CompletedProcess:
    """Run ``pipeline`` of the project at ``root`` through Snakemake, as a user would."""
    tool = Path(sys.executable).parent / "snakemake"
    cmd = [str(tool) if tool.exists() else "snakemake", "--cores", str(cores)]
    cmd += ["--resources", "gpu=1", "--config", f"pipeline={pipeline}"]
    return subprocess.run(cmd, cwd=root, env=environment(root), capture_output=True, text=True)


def in_process(root: Path, pipeline: str) -> None:
    """Run every stage of ``pipeline`` in this process (one torch import; the suite's way)."""
    run_stages_in_process(root, [pipeline])


def _run(root: Path, pipeline: str, cores: str, here: bool) -> str | None:
    """Rehearse one pipeline of the project; None, or what went wrong."""
    if here:
        try:
            in_process(root, pipeline)
        except Exception:
            return traceback.format_exc()[-4000:]
        return None
    proc = snakemake(root, pipeline, cores)
    return f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}" if proc.returncode else None


def main(argv: list[str] | None = None) -> int:
    from fedssl.presets import Presets

    ap = argparse.ArgumentParser(prog="python -m tests.rehearsal", description=__doc__)
    ap.add_argument("pipelines", nargs="*", help="default: every paper_* pipeline")
    ap.add_argument("--all", action="store_true", help="every experiment, not one per shape")
    ap.add_argument("--cores", default="all")
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="run the stages in this process, upstream first, instead of through Snakemake "
        "(one torch import: where starting a process is slow)",
    )
    ap.add_argument("--root", type=Path, help="build the project here and keep it")
    args = ap.parse_args(argv)
    pipelines = args.pipelines or paper_pipelines(Presets(REPO / "params"))
    root = args.root or Path(tempfile.mkdtemp(prefix="rehearsal-"))
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    chosen = choose(Presets(REPO / "params"), pipelines, args.all)
    build(root, chosen)
    # One project for all: a later pipeline reuses the stages an earlier one ran (named by
    # content), so each time below is what that pipeline added.
    failed = []
    for pipeline, names in chosen.items():
        start = time.perf_counter()
        problem = _run(root, pipeline, args.cores, args.in_process)
        wall = time.perf_counter() - start
        status = "FAILED" if problem else "ok"
        print(f"{pipeline:34s} {len(names):3d} experiments {wall:7.1f} s  {status}", flush=True)
        if problem:
            failed.append(pipeline)
            print(problem, flush=True)
    if failed or args.root:
        print(f"project kept in {root}")
    else:
        shutil.rmtree(root)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
