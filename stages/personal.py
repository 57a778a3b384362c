"""Stage: personalised evaluation of an experiment (each client's model on its own test split,
every round), summarised from the ``personal.npz`` its method's step wrote. Numbers the step
measured itself (restarts, a relevance score, ...) come along when it also wrote
``extra_metrics.json`` (a flat mapping) beside that file."""

from __future__ import annotations

import json

from fedssl.eval.personal import summarize
from fedssl.stage.context import main_guard
from fedssl.stage.runtime import write_json
from stages.common import context

EXTRA = "extra_metrics.json"


def run(argv):
    ctx = context("personal", argv, "a params/experiments/<name>.yaml preset")
    source = next(ctx.input(step) for step in ctx.method.personal_inputs)
    with ctx.run():
        metrics = summarize(source / "personal.npz", ctx.exp.personal, ctx.true_groups())
        if (source / EXTRA).exists():
            extra = json.loads((source / EXTRA).read_text())
            metrics.update({k: v for k, v in extra.items() if k not in metrics})
        write_json(ctx.results_dir / "metrics.json", metrics)
        ctx.info["metrics"] = metrics


if __name__ == "__main__":
    main_guard(run)
