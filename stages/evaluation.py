"""Stage: a shared evaluation of an experiment, ``python -m stages.evaluation KIND EXPERIMENT``:
the experiment's params validated, then the evaluation's ``run`` (its file under
:mod:`fedssl.evaluations` holds all of it)."""

from __future__ import annotations

import argparse

import torch  # noqa: F401  (imported first so that FEDSSL_THREADS applies to it)

from fedssl import evaluations
from fedssl.stage.context import StageContext, main_guard


def run(argv):
    ap = argparse.ArgumentParser(prog="python -m stages.evaluation")
    ap.add_argument("kind", help="a shared evaluation (fedssl/evaluations/<kind>.py)")
    ap.add_argument("experiment", help="a params/experiments preset (or grid member)")
    args = ap.parse_args(argv)
    evaluations.get(args.kind).run(StageContext(args.kind, args.experiment))


if __name__ == "__main__":
    main_guard(run)
