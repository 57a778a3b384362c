"""What a MocoSFL / MonAcoSFL run logs and keeps (its recipe's ``monitor`` and ``outputs``,
:mod:`.train`): the k-NN monitor of the split model, and from the finished run the final model
in its two parts, the step log and its misalignment figure, the communication check and the
step's metrics."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from fedssl.eval.monitor import KnnMonitor, monitor_of
from fedssl.methods.mocosfl import MocoSflParams, paper_layer
from fedssl.methods.mocosfl.comm import check_ledger
from fedssl.methods.mocosfl.nets import SplitNets
from fedssl.params import KnnParams
from fedssl.rounds.recipe import FinishedRun
from fedssl.stage.contract import StepContext
from fedssl.stage.runtime import torch_save, write_json, write_tsv

# steps.tsv, one row per logged step. Misalignment of this round's clients' online and
# momentum models, per parameter element: `misalignment_sq_pre_sync` = the authors' log
# (squared, before this step's sync); `misalignment` / `misalignment_sq` = Eq. 2 (absolute) /
# squared after the step and its sync; `misalignment_pre_sync` = Eq. 2 just before a sync.
STEP_FIELDS = [
    "step",
    "round",
    "loss",
    "sync",
    "misalignment_sq_pre_sync",
    "misalignment_pre_sync",
    "misalignment",
    "misalignment_sq",
]


def split_monitor(
    ctx: StepContext, p: MocoSflParams, nets: SplitNets, device: torch.device
) -> KnnMonitor | None:
    """The k-NN monitor of the split model (the library's, on the synced client part and the
    server's backbone): a labelled bank from the clients' training images, queries from the
    partition's server holdout (or the test split)."""
    m = p.monitor
    if m.every == 0:
        return None
    knn = KnnParams(k=m.k, temperature=m.temperature)
    sizes = (m.bank_size, m.query_size)
    rounds = p.federation.rounds
    return monitor_of(ctx, nets.embedding, device, m.every, rounds, p.seed, knn, sizes, m.queries)


# the step's metrics the run record repeats
RECORDED = (
    "comm_matches_formula",
    "mis_after_sync_mean",
    "mis_pre_sync_mean",
    "mis_sq_pre_sync_mean",
)


def split_outputs(p: MocoSflParams, run: FinishedRun) -> dict:
    """The finished run's outputs: the final model as its two parts (``model.pt``), the step
    log and its figure (results), the communication check and the metrics; returns the run
    record's facts (parameters deployed, on the client, and the metrics it repeats)."""
    ctx, nets, state = run.ctx, run.model, run.state
    final = run.strategy.final_model(state)
    torch_save(
        {
            "client": final["client"],
            "server": final["server"],
            "image_shape": tuple(ctx.image_shape),
            "cut": p.cut,
        },
        ctx.out / "model.pt",
    )
    steps = state.memo.get("steps", [])
    write_tsv(steps, ctx.results_dir / "steps.tsv", STEP_FIELDS)
    plot_misalignment(steps, ctx.results_dir / "misalignment.png", ctx.exp.title)
    summary = summarize(p, nets, ctx.image_shape, state, run.data.sizes())
    write_json(ctx.out / "communication_check.json", summary.pop("_check"))
    write_json(ctx.out / "metrics.json", summary)
    server = sum(v.numel() for k, v in final["server"].items() if k.startswith("backbone."))
    return {
        "parameters": nets.client_numel() + server,
        "client_parameters": nets.client_numel(),
        **{k: summary[k] for k in RECORDED},
    }


def summarize(p, nets: SplitNets, image_shape, state, sizes: list[int]) -> dict:
    """The step's report metrics: misalignment (Eq. 2's around the syncs, the authors' over
    every logged step), the last k-NN monitor value, communication per client (measured,
    protocol formula, paper formula)."""
    steps = state.memo.get("steps", [])
    syncs = [s for s in steps if s["sync"]]
    act = math.prod(nets.activation_shape(image_shape))
    n = len(sizes)
    check = check_ledger(
        state.ledger.summary(),
        state.memo.get("images", [0] * n),
        state.memo.get("syncs", [0] * n),
        state.memo.get("catch_ups", [0] * n),
        act,
        nets.client_numel(),
        p.variant == "monacosfl",
    )
    clients = check["per_client"]
    knn = [r["knn_monitor"] for r in state.log if "knn_monitor" in r]
    kinds = _mean_mb_by_kind(clients, n)

    def mean(xs):
        return float(np.mean(xs)) if xs else None

    return {
        "variant": p.variant,
        "clients": n,
        "cut": p.cut,
        "cut_layer": paper_layer(p) or "",
        "seed": p.seed,
        "steps": state.memo.get("step", 0),
        "syncs": len(syncs),
        "knn_monitor_last": knn[-1] if knn else "",
        "mis_pre_sync_mean": mean([s["misalignment_pre_sync"] for s in syncs]),
        "mis_after_sync_mean": mean([s["misalignment"] for s in syncs]),
        "mis_sq_pre_sync_mean": mean([s["misalignment_sq_pre_sync"] for s in steps]),
        "mis_final": steps[-1]["misalignment"] if steps else None,
        "loss_final": state.log[-1]["loss"] if state.log else None,
        "client_MB_total": round(float(np.mean([c["bytes_total"] for c in clients])) / 1e6, 4),
        "client_MB_paper_formula": round(
            float(np.mean([c["paper_formula_bytes"] for c in clients])) / 1e6, 4
        ),
        **{k: round(v, 4) for k, v in sorted(kinds.items())},
        "act_numel": act,
        "client_params": nets.client_numel(),
        "comm_matches_formula": check["exact"],
        "_check": check,
    }


def _mean_mb_by_kind(clients: list[dict], n: int) -> dict[str, float]:
    """MB a client sends (``MB_up_<kind>``) and receives (``MB_down_<kind>``) per kind of
    tensor, the mean over the ``n`` clients of the ledger check."""
    kinds: dict[str, float] = {}
    for c in clients:
        for direction in ("up_by_kind", "down_by_kind"):
            for kind, b in c[direction].items():
                key = f"MB_{direction[:-8]}_{kind}"
                kinds[key] = kinds.get(key, 0.0) + b / 1e6 / n
    return kinds


# The two misalignment measures of steps.tsv: column -> axis label
MISALIGNMENT_CURVES = {
    "misalignment": "Eq. 2: |online - momentum|, after sync",
    "misalignment_sq_pre_sync": "authors' log: squared, before sync",
}


def plot_misalignment(steps: list[dict], path: Path, title: str) -> None:
    """Both misalignment measures per step (log scale, one panel each), syncs marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.2))
    FigureCanvasAgg(fig)
    for i, (column, label) in enumerate(MISALIGNMENT_CURVES.items()):
        ax = fig.add_subplot(1, 2, i + 1)
        if steps:
            ax.plot([s["step"] for s in steps], [s[column] for s in steps], lw=1)
            for s in steps:
                if s["sync"]:
                    ax.axvline(s["step"], color="tab:blue", alpha=0.2, lw=0.8)
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel(label, fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
