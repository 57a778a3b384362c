"""Stage: per-client costs of an experiment's federated method, from the method's hook (bits
in the papers' convention and bytes actually sent, FLOPs counted with FlopCounterMode, memory).
Runs on the CPU: FLOP counts do not depend on the device."""

from __future__ import annotations

import torch  # noqa: F401  (imported first so that FEDSSL_THREADS applies to it)

from fedssl.costs import summarize_client_costs
from fedssl.stage.context import main_guard
from fedssl.stage.runtime import write_json
from stages.common import context


def run(argv):
    ctx = context("costs", argv, "a params/experiments/<name>.yaml preset")
    with ctx.run() as out:
        rows = ctx.method.client_costs(ctx)
        summary = summarize_client_costs(rows, ctx.method.cost_columns)
        write_json(out / "costs.json", {"per_client": rows, **summary})
        ctx.info.update(summary)


if __name__ == "__main__":
    main_guard(run)
