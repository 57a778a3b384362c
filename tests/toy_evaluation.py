"""A toy shared evaluation: how evenly a partition spreads the training images over the
clients. The test copies it to a project's fedssl/evaluations/client_balance.py, the one file
an evaluation is (docs/how-to/add-an-evaluation.md)."""

from __future__ import annotations

from fedssl.evaluations import PARTITION, Evaluation, Metric, register


def run(ctx) -> None:
    from fedssl.data import load_clients
    from fedssl.stage.runtime import write_json

    sizes = [len(c) for c in load_clients(ctx.input("partition"))]
    with ctx.run():
        metrics = {"clients": len(sizes), "largest_share": round(max(sizes) / sum(sizes), 4)}
        write_json(ctx.results_dir / "balance.json", metrics)
        ctx.info["metrics"] = metrics


register(
    Evaluation(
        "client_balance",
        ("partition",),
        (PARTITION,),
        lambda method, exp: True,
        order=60,
        metrics=("balance.json",),
        declares=(Metric("largest_share", "largest client share", order=60, unit="",
                         higher_is_better=False),),
        run=run,
    )
)  # fmt: skip
