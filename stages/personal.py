"""Stage: personalised evaluation of an experiment (each client's model on its own test split,
every round), summarised from the ``personal.npz`` its method's step wrote."""
from __future__ import annotations

from fedssl.eval.personal import summarize
from fedssl.runtime import write_json
from fedssl.stage import main_guard
from stages.common import context


def run(argv):
    ctx = context("personal", argv, "a params/experiments/<name>.yaml preset")
    source = next(ctx.input(step) for step in ctx.method.personal_inputs)
    with ctx.run():
        metrics = summarize(source / "personal.npz", ctx.exp.personal, ctx.true_groups())
        write_json(ctx.results_dir / "metrics.json", metrics)
        ctx.info["metrics"] = metrics


if __name__ == "__main__":
    main_guard(run)
