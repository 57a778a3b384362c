"""MocoSFL / MonAcoSFL stages (imported when they run) besides the split federation (which
the one runtime runs from the recipe, :mod:`.train`): the model-inversion attack
(``inversion``) and the frozen encoder for the probes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedssl.data import to_device
from fedssl.data.augment import to_float
from fedssl.data.partition import stratified_subset
from fedssl.methods.mocosfl.nets import SplitEncoder, build_nets
from fedssl.stage.contract import StepContext
from fedssl.stage.runtime import derive_seed, write_json


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
