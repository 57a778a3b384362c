"""MocoSFL / MonAcoSFL stages (imported when they run): the split federation (``pretrain``),
the model-inversion attack (``inversion``) and the frozen encoder for the probes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from fedssl.data import to_device
from fedssl.data.augment import to_float
from fedssl.data.partition import stratified_subset
from fedssl.eval.monitor import KnnMonitor, monitor_of
from fedssl.methods.mocosfl import MocoSflParams, paper_layer
from fedssl.methods.mocosfl.comm import check_ledger
from fedssl.methods.mocosfl.nets import SplitEncoder, SplitNets, build_nets
from fedssl.methods.mocosfl.train import recipe
from fedssl.params import KnnParams
from fedssl.rounds.recipe import build_federation
from fedssl.rounds.runner import run_federation, train_data
from fedssl.stage.contract import StepContext
from fedssl.stage.runtime import derive_seed, torch_save, write_json, write_tsv

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


# ============================================================================ pretrain
def pretrain(ctx: StepContext) -> None:
    p = ctx.exp.method
    data = train_data(ctx)
    split = recipe(p)
    nets = split.model(ctx.image_shape, ctx.device)
    fed = build_federation(split, nets, data, ctx.resume_path, ctx.fingerprint)
    fed.monitor = split_monitor(ctx, p, nets, data.device)
    print(
        f"{p.variant}: cut {p.cut} (L{paper_layer(p)}), {len(data.clients)} clients, "
        f"{'vectorised' if fed.trainer.parallel else 'one by one'}",
        flush=True,
    )
    state = run_federation(ctx, fed)
    final = fed.strategy.final_model(state)
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
    summary = summarize(p, nets, ctx.image_shape, state, data.sizes())
    write_json(ctx.out / "communication_check.json", summary.pop("_check"))
    write_json(ctx.out / "metrics.json", summary)
    ctx.info.update(
        parameters=nets.client_numel()
        + sum(v.numel() for k, v in final["server"].items() if k.startswith("backbone.")),
        client_parameters=nets.client_numel(),
        **{
            k: summary[k]
            for k in (
                "comm_matches_formula",
                "mis_after_sync_mean",
                "mis_pre_sync_mean",
                "mis_sq_pre_sync_mean",
            )
        },
    )


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


# ============================================================================ encoder
def load_final(ctx: StepContext, step_dir: Path | None = None):
    p = ctx.exp.method
    ckpt = torch.load(
        (step_dir or ctx.input("pretrain")) / "model.pt", map_location=ctx.device, weights_only=True
    )
    return p, ckpt


def encoder_skeleton(p, image_shape, projection: bool = False) -> SplitEncoder:
    """The untrained module :func:`encoder` returns (for :mod:`fedssl.export`)."""
    from fedssl.models.encoders import frozen

    nets = build_nets(p, image_shape, torch.device("cpu"))
    return frozen(SplitEncoder(nets, nets.client.state_dict(), nets.top.state_dict(), projection))


def encoder(ctx: StepContext) -> SplitEncoder:
    """The frozen deployed model: the final synced client part + the server's backbone part
    (pooled features; ``features.layer: projection`` adds the projector)."""
    from fedssl.models.encoders import frozen

    p, ckpt = load_final(ctx)
    nets = build_nets(p, ckpt["image_shape"], ctx.device)
    return frozen(
        SplitEncoder(nets, ckpt["client"], ckpt["server"], ctx.exp.features.layer == "projection")
    )


# ============================================================================ inversion
def inversion(ctx: StepContext) -> None:
    """§5.3: the attacker holds ``aux_fraction`` of the clients' training images, runs them
    through the final client model, trains a decoder from activations to images (MSE, Adam),
    and is scored on test images by MSE (higher = more private) and SSIM."""
    from fedssl.attacks.inversion import invert, reconstruction_mse, ssim

    p, ckpt = load_final(ctx)
    inv = p.inversion
    nets = build_nets(p, ckpt["image_shape"], ctx.device)
    nets.client.load_state_dict(ckpt["client"])
    nets.client.eval()
    aux_images, eval_images = _inversion_images(ctx, p)
    h_aux, x_aux = _client_activations(nets, aux_images, ctx.device)
    decoder, history = _train_attacker(p, h_aux, x_aux, ctx.device)
    h_ev, x_ev = _client_activations(nets, eval_images, ctx.device)
    recon = invert(decoder, h_ev)
    mse = reconstruction_mse(recon, x_ev)
    score = ssim(recon, x_ev)
    # a reference: the decoder-free guess of the mean auxiliary image
    mean_mse = reconstruction_mse(x_aux.mean(0, keepdim=True).expand_as(x_ev), x_ev)
    metrics = {
        "inversion_mse": round(float(mse.mean()), 5),
        "inversion_ssim": round(float(score.mean()), 4),
        "inversion_mse_mean_image": round(float(mean_mse.mean()), 5),
        "inversion_aux_images": int(len(aux_images)),
        "inversion_train_mse_last": round(history[-1], 5),
    }
    write_json(ctx.out / "metrics.json", metrics)
    plot_reconstructions(
        x_ev[: inv.show].cpu(),
        recon[: inv.show].cpu(),
        ctx.results_dir / "inversion.png",
        f"{ctx.exp.title}: MSE {metrics['inversion_mse']:.4f}, "
        f"SSIM {metrics['inversion_ssim']:.3f}",
    )
    c, hh, _ = h_aux.shape[1:]
    ctx.info.update(metrics, activation_shape=[c, hh, hh])


def _train_attacker(p, h_aux: torch.Tensor, x_aux: torch.Tensor, device):
    """The attacker's decoder from activations to images, seeded and trained on its
    auxiliary images; returns it and its training losses."""
    from fedssl.attacks.inversion import InversionDecoder, train_decoder

    inv = p.inversion
    c, hh, _ = h_aux.shape[1:]
    torch.manual_seed(derive_seed(p.seed, "inversion-decoder"))
    decoder = InversionDecoder(c, x_aux.shape[1], hh, x_aux.shape[-1], inv.width).to(device)
    history = train_decoder(
        decoder,
        h_aux,
        x_aux,
        inv.epochs,
        inv.batch_size,
        inv.lr,
        derive_seed(p.seed, "inversion-train"),
    )
    return decoder, history


def _inversion_images(ctx: StepContext, p) -> tuple[np.ndarray, np.ndarray]:
    """The attacker's auxiliary images (a stratified ``aux_fraction`` of the clients' training
    images) and the test images it is scored on (a stratified ``eval_images``), seeded."""
    inv = p.inversion
    train_images, train_labels = ctx.split("train")
    pool = np.sort(np.concatenate(ctx.clients()))
    aux = pool[
        stratified_subset(
            train_labels[pool],
            max(1, round(inv.aux_fraction * len(pool))),
            derive_seed(p.seed, "inversion-aux"),
        )
    ]
    test_images, test_labels = ctx.split("test")
    ev = stratified_subset(
        test_labels, min(inv.eval_images, len(test_labels)), derive_seed(p.seed, "inversion-eval")
    )
    return train_images[aux], test_images[ev]


@torch.no_grad()
def _client_activations(nets, images: np.ndarray, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The final client model's activations of ``images`` (in chunks of 256), and the images
    as floats on the device."""
    x = to_float(to_device(images, device))
    return torch.cat([nets.client(c) for c in x.split(256)]), x


def plot_reconstructions(
    originals: torch.Tensor, recon: torch.Tensor, path: Path, title: str
) -> None:
    """Two rows: test images, and the attacker's reconstructions from their activations."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = originals.shape[0]
    fig = Figure(figsize=(1.1 * n, 2.6))
    FigureCanvasAgg(fig)
    for row, images in enumerate((originals, recon)):
        for i in range(n):
            ax = fig.add_subplot(2, n, row * n + i + 1)
            img = images[i].permute(1, 2, 0).clamp(0, 1).numpy()
            ax.imshow(img[..., 0] if img.shape[-1] == 1 else img, cmap="gray", vmin=0, vmax=1)
            ax.set_axis_off()
    fig.suptitle(title, fontsize=8)
    fig.savefig(path, dpi=100)
