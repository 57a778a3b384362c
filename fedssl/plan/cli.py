"""The planning command line: ``python -m fedssl.pipeline write | check | commit | accept |
show`` (see ``--help``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedssl import params as P
from fedssl.plan.dag import Dag
from fedssl.plan.dvcfile import (
    check,
    commit_ran,
    dvc_commit,
    dvc_file,
    owners,
    relock,
    write_all,
)
from fedssl.plan.freshness import accept


def downstream_of(dag: Dag, name: str, stages: list[str]) -> bool:
    """Whether stage ``name`` reads, directly or not, the output of one of ``stages``."""
    up = dag.stages[name].upstream
    return any(u in stages or downstream_of(dag, u, stages) for u in up)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m fedssl.pipeline",
        description="the pipelines' DAG: generate, check and record",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    write = sub.add_parser(
        "write",
        help="regenerate dvc.yaml and pipelines/*/dvc.yaml of the "
        "pipelines run so far (and of those named)",
    )
    write.add_argument("pipelines", nargs="*", help="also write these pipelines' dvc.yaml")
    sub.add_parser("check", help="validate and regenerate; fail when the shape changed")
    sub.add_parser("commit", help="dvc-commit the stages Snakemake ran")
    sub.add_parser(
        "relock",
        help="record in dvc.lock the code the root's stages now run, their outputs as locked "
        "(after edits shown not to change them)",
    )
    acc = sub.add_parser(
        "accept",
        help="declare stages up to date without running them "
        "(after an edit that cannot change their outputs)",
    )
    acc.add_argument("pipeline")
    acc.add_argument("stages", nargs="*", help="only these (default: every stale stage)")
    show = sub.add_parser("show", help="list a pipeline's stages")
    show.add_argument("pipeline", nargs="?", default="default")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.cmd == "write":
            for p in write_all(also=tuple(args.pipelines)):
                print(f"wrote {p}")
        elif args.cmd == "check":
            return check()
        elif args.cmd == "commit":
            commit_ran()
        elif args.cmd == "relock":
            print("relocked: " + (", ".join(relock()) or "nothing had changed"))
        elif args.cmd == "accept":
            return accept_stages(args.pipeline, args.stages)
        else:
            for name in Dag(args.pipeline).stages:
                print(name)
    except P.ParamsError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


def accept_stages(pipeline: str, stages: list[str]) -> int:
    """Declare ``stages`` (default: every stale one) of ``pipeline`` up to date, and have DVC
    record them and every stage that reads them."""
    dag = Dag(pipeline)
    names = accept(dag, stages or None)
    print("accepted: " + (", ".join(names) or "nothing was stale"))
    if not (names and Path(".dvc").is_dir()):
        return 0
    owner = owners()
    # an accepted stage's meta.json is part of its output, so DVC sees every stage that reads
    # it as changed too: commit those as well
    commit = [n for n in dag.stages if n in names or downstream_of(dag, n, names)]
    failed = dvc_commit([f"{dvc_file(owner[n][0])}:{n}" for n in commit if n in owner])
    if failed:  # e.g. an output the stages now declare is missing
        print(
            "error: dvc commit failed: DVC still sees these stages as changed; "
            "rerun them (an output they declare may be missing)",
            file=sys.stderr,
        )
    return failed
