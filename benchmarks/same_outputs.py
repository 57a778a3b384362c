"""Do two versions of the code train the same tensors? Runs every method's tiny chain test (the
whole DAG of a tiny project, in process, on the CPU) with one checkout's code, keeping the
projects; then compares the two runs' stage outputs and committed results file by file.

    python benchmarks/same_outputs.py run /tmp/old_checkout /tmp/runs_old
    python benchmarks/same_outputs.py run .                  /tmp/runs_new
    python benchmarks/same_outputs.py compare /tmp/runs_old /tmp/runs_new

A refactor that keeps training numerically identical leaves every file the same: byte for
byte, or as tensors for checkpoints; timings (meta.json, run records, timing columns of epoch
logs) and the planner's caches are left out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHAINS = (
    "tests/methods/cpcfl/test_cpcfl.py::test_the_cpcfl_chain_runs_end_to_end_on_a_tiny_project",
    "tests/methods/mfcl/test_mfcl.py::test_mfcl_chain_runs_end_to_end_on_a_tiny_project",
    "tests/methods/mocosfl/test_mocosfl.py::test_the_chain_runs_on_a_tiny_project",
    "tests/methods/mpfedcon/test_mpfedcon_chain.py::test_mpfedcon_chain_runs_end_to_end_on_a_tiny_project",
    "tests/methods/lwfedssl/test_lwfedssl.py::test_the_family_runs_end_to_end_on_a_tiny_project",
    "tests/methods/featarc/test_featarc_chain.py::test_the_featarc_chain_runs_on_a_tiny_project",
    "tests/methods/orchestra/test_orchestra_chain.py::test_the_orchestra_chain_runs_on_a_tiny_project",
)


def run(checkout: Path, out: Path) -> None:
    checkout = checkout.resolve()
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={out.resolve()}",
            *CHAINS,
        ],
        cwd=checkout,
        env=env,
        check=True,
    )


TIMINGS = {"seconds", "images_per_s"}  # columns some epoch logs keep beside the losses


def outputs(root: Path) -> dict[str, Path]:
    """Every stage output and committed result of the tiny projects under ``root``, but the
    run records (meta.json, artifacts/.runs), which hold timings and code hashes, and the
    planner's caches (artifacts/.cache: the parsed imports of the code, keyed by its text)."""
    return {
        str(p.relative_to(root)): p
        for p in sorted(root.glob("*/*/**/*"))
        if p.is_file()
        and not (root / p.relative_to(root).parts[0]).is_symlink()
        and p.relative_to(root).parts[1] in ("artifacts", "results")
        and p.name != "meta.json"
        and ".runs" not in p.parts
        and ".cache" not in p.parts
        and ".dvc" not in p.parts
    }


def same_tensors(x, y) -> bool:
    import torch

    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, dict):
        return (
            isinstance(y, dict)
            and x.keys() == y.keys()
            and all(same_tensors(x[k], y[k]) for k in x)
        )
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(same_tensors(a, b) for a, b in zip(x, y))
    return x == y


def without_timings(path: Path) -> list[list[str]]:
    rows = [line.split("\t") for line in path.read_text().splitlines()]
    keep = [i for i, name in enumerate(rows[0] if rows else []) if name not in TIMINGS]
    return [[row[i] for i in keep] for row in rows]


def same(a: Path, b: Path) -> bool:
    """Byte-identical, or the same tensors (.pt), or the same table but for timings (.tsv)."""
    if a.read_bytes() == b.read_bytes():
        return True
    if a.suffix == ".pt":
        import torch

        return same_tensors(torch.load(a, weights_only=True), torch.load(b, weights_only=True))
    return a.suffix == ".tsv" and without_timings(a) == without_timings(b)


def compare(a: Path, b: Path) -> int:
    old, new = outputs(a), outputs(b)
    if not old:
        print(f"no stage outputs under {a}")
        return 1
    differ = [k for k in sorted(old.keys() & new.keys()) if not same(old[k], new[k])]
    missing = sorted(old.keys() ^ new.keys())
    for k in differ:
        print("differs:", k)
    for k in missing:
        print("only in one run:", k)
    print(
        f"{len(old.keys() & new.keys()) - len(differ)} files identical, {len(differ)} "
        f"differ, {len(missing)} unmatched"
    )
    return 1 if differ or missing else 0


if __name__ == "__main__":
    command, first, second = sys.argv[1:4]
    if command == "run":
        run(Path(first), Path(second))
    else:
        sys.exit(compare(Path(first), Path(second)))
