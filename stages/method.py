"""Stage: one step of an experiment's method (``python -m stages.method STEP EXPERIMENT``):
federated pretraining, MFCL's export or rServer, ... whatever the method plugin declares. The
method's hook does the work; this script only validates, times and records it."""

from __future__ import annotations

import argparse

from fedssl.stage.context import StageContext, main_guard


def run(argv):
    ap = argparse.ArgumentParser(prog="python -m stages.method")
    ap.add_argument("step", help="a step the experiment's method declares (e.g. pretrain)")
    ap.add_argument("experiment", help="a params/experiments preset (or grid member)")
    args = ap.parse_args(argv)
    ctx = StageContext(args.step, args.experiment)
    with ctx.run():
        ctx.method.run_step(args.step, ctx)
    ctx.done()


if __name__ == "__main__":
    main_guard(run)
