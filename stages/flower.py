"""Stage: a method's federated step as a Flower app (``python -m stages.flower STEP
EXPERIMENT``, needs ``pip install -e '.[flower]'``). It writes the outputs of ``python -m
stages.method STEP EXPERIMENT`` (model, round log, byte ledger) into the same stage folder, so
features, probes, costs and reports read it unchanged; its rounds run in Flower's simulation
engine, one SuperNode per client."""

from __future__ import annotations

import argparse

from fedssl.stage.context import StageContext, main_guard


def run(argv):
    ap = argparse.ArgumentParser(prog="fedssl flower")
    ap.add_argument("step", help="a step the method runs on Flower (e.g. pretrain)")
    ap.add_argument("experiment", help="a params/experiments preset (or grid member)")
    args = ap.parse_args(argv)
    ctx = StageContext(args.step, args.experiment)
    from fedssl.flower.stage import flower_hook, run_step

    flower_hook(ctx.method, args.step)  # before any compute
    with ctx.run():
        run_step(ctx, args.step)
    ctx.done()


if __name__ == "__main__":
    main_guard(run)
