"""``python -m fedssl.plan.dvccommit TARGET...``: ``dvc commit --force`` of stages
(``dvc.yaml:stage``), one line per stage as it is recorded. DVC hashes and caches every output
it records, minutes for a large run (3 of a 10-minute run), and says nothing meanwhile in a log;
here DVC's repository is opened once, as its own command does, and each stage is said with
its size and time. Run as a process of its own: DVC stays out of Snakemake's."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(targets: list[str]) -> int:
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    start, failed = time.time(), 0
    with Repo(os.getcwd()) as repo:
        for i, target in enumerate(targets, 1):
            began = time.time()
            try:
                stages = repo.commit(target, force=True)
            except DvcException as err:
                print(f"dvc commit {target}: failed: {err}", file=sys.stderr, flush=True)
                failed += 1
                continue
            outs = [Path(o.fs_path) for s in stages for o in s.outs if Path(o.fs_path).exists()]
            print(
                f"dvc commit [{i}/{len(targets)}] {target.rpartition(':')[2]}: "
                f"{sum(map(size, outs)) / 1e6:.1f} MB in {time.time() - began:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    print(f"dvc commit: {len(targets)} stages in {time.time() - start:.1f} s", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
