"""A toy shared evaluation's stage script: how evenly a partition spreads the training images
over the clients. The test copies it to a project's stages/client_balance.py and drops its
declaration into fedssl/evaluations/ (see README, "Adding an evaluation")."""

from __future__ import annotations

from fedssl.data import load_clients
from fedssl.stage.context import main_guard
from fedssl.stage.runtime import write_json
from stages.common import context


def run(argv):
    ctx = context("client_balance", argv, "a params/experiments/<name>.yaml preset")
    sizes = [len(c) for c in load_clients(ctx.input("partition"))]
    with ctx.run():
        metrics = {"clients": len(sizes), "largest_share": round(max(sizes) / sum(sizes), 4)}
        write_json(ctx.results_dir / "balance.json", metrics)
        ctx.info["metrics"] = metrics


if __name__ == "__main__":
    main_guard(run)
