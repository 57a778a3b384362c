"""Client costs, from the method's cost hook and the steps it reads (bits in the papers'
convention and bytes actually sent, FLOPs counted with FlopCounterMode, memory; on the CPU:
FLOP counts do not depend on the device), and the per-client means it reports, under the same
names for every method (a paper's own symbols head only the tables of its plugin)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedssl.evaluations import PARTITION, Evaluation, Metric, register

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

# The costs file's means (mean over clients of each client's total over the run), in the
# order of the report's full table.
PAPER_BITS = Metric(
    "paper_bits",
    "bits by the paper's formula / client",
    order=110,
    unit="bits",
    higher_is_better=False,
    costs="paper_bits",
)
CLIENT_MB_EXCHANGED = Metric(
    "client_MB_exchanged",
    "MB sent + received / client",
    order=120,
    unit="MB",
    higher_is_better=False,
    costs="bytes_exchanged",
    scale=1e-6,
    beside=True,
)
# The encoder's share of that traffic (its parameters, without the heads trained on top),
# where the ledger tells it apart (fedssl.costs.ENCODER_KINDS): what papers that exchange
# only an encoder count. A column of the full table; the board shows it after the total.
CLIENT_MB_ENCODER = Metric(
    "client_MB_encoder",
    "encoder MB sent + received / client",
    order=125,
    unit="MB",
    higher_is_better=False,
    costs="encoder_bytes_exchanged",
    scale=1e-6,
)
CLIENT_GFLOPS = Metric(
    "client_GFLOPs",
    "GFLOPs / client",
    order=130,
    unit="GFLOPs",
    higher_is_better=False,
    costs="flops",
    scale=1e-9,
    beside=True,
)
PAPER_MEMORY_MB = Metric(
    "paper_memory_MB",
    "memory by the paper's formula, MB / client",
    order=140,
    unit="MB",
    higher_is_better=False,
    costs="paper_memory_bytes",
    scale=1e-6,
)
PEAK_STEP_MB = Metric(
    "peak_step_MB",
    "peak step MB / client",
    order=150,
    unit="MB",
    higher_is_better=False,
    costs="peak_step_bytes",
    scale=1e-6,
    beside=True,
)


def run(ctx: StepContext) -> None:
    from fedssl.costs import add_encoder_bytes, summarize_client_costs
    from fedssl.stage.runtime import write_json

    with ctx.run() as out:
        steps = ctx.method.costs_inputs_for(ctx.exp.method) or ()
        rows = add_encoder_bytes(ctx.method.client_costs(ctx), [ctx.input(s) for s in steps])
        summary = summarize_client_costs(rows, ctx.method.cost_columns)
        write_json(out / "costs.json", {"per_client": rows, **summary})
        ctx.info.update(summary)


register(
    Evaluation(
        "costs",
        (),
        (PARTITION,),
        lambda method, exp: method.costs_inputs_for(exp.method) is not None,
        order=50,
        uses="costs",
        declares=(
            PAPER_BITS,
            CLIENT_MB_EXCHANGED,
            CLIENT_MB_ENCODER,
            CLIENT_GFLOPS,
            PAPER_MEMORY_MB,
            PEAK_STEP_MB,
        ),
        run=run,
    )
)
