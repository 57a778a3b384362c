"""MFCL's stages (imported when they run): phase 1, rServer and the deployed encoder, and the
clients' export (the export step itself: :mod:`fedssl.methods.mfcl.export`; the per-client
costs: :mod:`fedssl.methods.mfcl.costs`). Composes the shared augmentation,
cohort trainer, engine, secure aggregation, losses and LARS."""

from __future__ import annotations

import json
import math
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedssl.data.augment import BatchAugment, multi_view
from fedssl.fl.cohort import LocalData, OptimizerConfig, forward
from fedssl.fl.state import federation_config, write_round_log
from fedssl.losses import nt_xent
from fedssl.models.autoencoder import (
    ClientAutoencoder,
    reconstruction_loss,
    resnet18_blocks_on_client,
)
from fedssl.models.encoders import frozen
from fedssl.models.rserver import MfclEncoder, RServerModel
from fedssl.rounds.loop import Federation
from fedssl.rounds.recipe import Local, Recipe, build_federation
from fedssl.rounds.runner import run_federation, train_data
from fedssl.stage.runtime import derive_seed, numpy_rng, torch_generator, torch_save, write_tsv
from fedssl.strategies.base import Strategy
from fedssl.strategies.secure_fedavg import SecureFedAvg
from fedssl.training.epochs import encoded, run_epochs, train_steps
from fedssl.training.optim import LARS, lars_param_groups, scaled_peak_lr, set_lr, warmup_cosine

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


def twin_batch(augment: BatchAugment):
    """Two independent views of every sample; the loss and the export stack them as one batch
    ordered [all view-1; all view-2] (rows k and k+K are twins, the layout Twin Norm expects)."""
    return multi_view(augment, views=2)


def autoencoder_loss(kind: str = "bce"):
    """Reconstruction of each augmented view from itself (Eq. 1). Padded samples of a short
    batch are dropped as whole pairs, so Twin Norm still sees intact twins."""

    def loss(model, params, buffers, batch):
        v1, v2 = batch.views
        valid = batch.valid
        x = torch.cat([v1, v2])
        logits = forward(model, (params, buffers), x)
        per_pixel = reconstruction_loss(
            logits.float(), model.reconstruction_target(x), kind, reduction="none"
        )
        keep = torch.cat([valid, valid]).float()
        per_image = per_pixel.flatten(1).mean(1)
        return (per_image * keep).sum() / keep.sum().clamp(min=1)

    return loss


# ============================================================================ pipeline pieces
# Everything below composes the shared library (augmentation, CohortTrainer/Federation, secure
# aggregation masks, LARS, NT-Xent) into the stages of MFCL: phase 1, export, rServer, encoder.


def build_client_module(p, image_shape, device) -> ClientAutoencoder:
    """The seeded initial client autoencoder of MFCL params ``p``."""
    cm = p.client_module
    torch.manual_seed(derive_seed(p.seed, "init", "mfcl-client"))
    return ClientAutoencoder(
        cm.arch,
        in_channels=image_shape[0],
        width=cm.width,
        norm=cm.norm,
        channels_per_group=cm.channels_per_group,
        tn_variance=cm.tn_variance,
        ae_pool=cm.ae_pool,
        cut=cm.cut,
    ).to(device)


def build_rserver(p, in_channels: int, device) -> RServerModel:
    """The seeded initial rServer model: the ResNet blocks the client module's cut left over."""
    rs, cm = p.rserver, p.client_module
    torch.manual_seed(derive_seed(rs.seed, "init", "mfcl-rserver"))
    return RServerModel(
        cm.arch,
        in_channels,
        rs.width,
        rs.proj_hidden,
        rs.proj_dim,
        skip_blocks=resnet18_blocks_on_client(cm.cut),
        restandardize=rs.restandardize,
        channels_per_group=cm.channels_per_group,
    ).to(device)


def phase1_recipe(p) -> Recipe:
    """Phase 1 (Alg. 1 l. 1-13): Adam on twin batches of K pairs, fresh optimizer state every
    round, size-weighted FedAvg of the whole autoencoder (optionally through secure
    aggregation), under the params' ``strategy`` choice (FedProx)."""
    p1 = p.phases.phase1.federation
    fedavg = SecureFedAvg if p1.secure_aggregation else Strategy
    return Recipe(
        config=federation_config(p1, p.seed),
        strategy=lambda cfg, model, data: fedavg(cfg),
        local=Local(
            views=lambda size: twin_batch(BatchAugment(p.augment, size)),
            batch_size=p1.batch_pairs,
            local_epochs=p1.local_epochs,
            optimizer=OptimizerConfig(kind="adam", eps=p1.adam_eps),
            step_loss=autoencoder_loss(p1.loss),
        ),
        parallel=p.parallel_clients,
        choice=p1,
    )


def make_phase1_federation(
    p, model: ClientAutoencoder, data: LocalData, ckpt: Path, fingerprint: str
) -> Federation:
    """Phase 1's federation over ``data``, training ``model``."""
    return build_federation(phase1_recipe(p), model, data, ckpt, fingerprint)


def phase1_federation(ctx: StepContext) -> tuple[ClientAutoencoder, Federation]:
    """Phase 1's client module and federation (what a Flower client builds too)."""
    p = ctx.exp.method
    model = build_client_module(p, ctx.image_shape, ctx.device)
    return model, make_phase1_federation(
        p, model, train_data(ctx), ctx.resume_path, ctx.fingerprint
    )


def phase1(ctx: StepContext) -> None:
    p = ctx.exp.method
    if p.phases.phase1.federation.rounds > 0:
        model, fed = phase1_federation(ctx)
        run_federation(ctx, fed, model)
    else:
        model = build_client_module(p, ctx.image_shape, ctx.device)
        write_round_log([], ctx.results_dir / "rounds.tsv")
        ctx.info.update(rounds=0, final_loss=None)
    torch_save(
        {"model": model.state_dict(), "image_shape": tuple(ctx.image_shape)}, ctx.out / "model.pt"
    )
    ctx.info.update(
        parameters=sum(q.numel() for q in model.parameters()),
        encoder_parameters=model.num_parameters("encoder"),
        secure_aggregation=p.phases.phase1.federation.secure_aggregation,
    )


# ---------------------------------------------------------------------------- export
def dropped_clients(num_clients: int, dropout: float, seed: int) -> list[int]:
    """Fig. 8: round(δ·M) clients (at least one kept), drawn once from the seed, send nothing."""
    k = min(num_clients - 1, round(dropout * num_clients))
    return sorted(numpy_rng(seed, "export-dropout").choice(num_clients, k, replace=False).tolist())


def encode_pair(
    model: ClientAutoencoder, v1: torch.Tensor, v2: torch.Tensor, tn_pairing: str = "twin"
) -> torch.Tensor:
    """Both views of a batch through the client module and its pool, ``[2K, C, h, w]`` (the
    first K rows from ``v1``, the last K from ``v2``). Twin Norm normalises rows k and k+K
    jointly; ``tn_pairing`` chooses what each view is normalised with: ``twin`` its sample's
    other view (the paper), ``self`` itself, ``cross`` the other view of the previous sample
    in the batch. (``pseudo`` pairs are made by the caller: ``v2`` holds other images.)"""
    if model.norm_kind != "tn" or tn_pairing in ("twin", "pseudo"):
        return model.encode(torch.cat([v1, v2]))
    k = len(v1)
    partner = {"self": lambda v, other: v, "cross": lambda v, other: other.roll(1, 0)}[tn_pairing]
    return torch.cat(
        [model.encode(torch.cat([v, partner(v, o)]))[:k] for v, o in ((v1, v2), (v2, v1))]
    )


@torch.no_grad()
def export_client(
    model: ClientAutoencoder,
    images: torch.Tensor,
    indices: np.ndarray,
    augment: BatchAugment,
    pairs: int,
    batch: int,
    seed: int,
    client: int,
    bn_mode: str = "eval",
    tn_pairing: str = "twin",
) -> torch.Tensor:
    """What client ``client`` sends to the rServer: for every local sample, ``pairs`` pairs of
    twin views through the frozen client module and its MaxPool, as fp16
    ``[n, pairs, 2, C, h, w]`` (``model.encode``'s output: H/2 × W/2, or H/4 × W/4 for a cut
    holding the stride-2 conv). Twin Norm pairs the two views of each sample again. Each
    (client, pair, chunk) draws its views from its own seeded generator."""
    model.train(bn_mode == "train")
    idx_all = torch.from_numpy(np.asarray(indices)).to(images.device)
    starts = range(0, len(indices), batch)
    slots = [(r, j, start) for r in range(pairs) for j, start in enumerate(starts)]

    def views():
        for r, j, start in slots:
            x = images[idx_all[start : start + batch]]
            gen = torch_generator(images.device, seed, "export", client, r, j)
            v1, v2 = twin_batch(augment)(x, gen)
            if tn_pairing == "pseudo":  # the "positive" is another image (the next one)
                v2 = v2.roll(-1, 0)
            yield model, v1, v2, tn_pairing

    out = None
    for (r, _, start), z in zip(slots, encoded(images.device, encode_pair, views()), strict=True):
        pair = torch.stack(z.to(torch.float16).chunk(2), 1)
        if out is None:
            out = torch.empty(
                (len(indices), pairs, *pair.shape[1:]), dtype=pair.dtype, device="cpu"
            )
        out[start : start + len(pair), r] = pair.cpu()
    model.eval()
    return out


# ---------------------------------------------------------------------------- rServer
def rserver_steps(num_samples: int, batch_pairs: int) -> int:
    """Steps per epoch: full batches only (as SimCLR), or one batch when there are fewer."""
    return max(1, num_samples // batch_pairs)


def train_rserver(
    model: RServerModel,
    reps: torch.Tensor,
    p,
    resume: Path | None = None,
    fingerprint: str = "",
    on_epoch=None,
) -> list[dict]:
    """Phase 2b: SimCLR on the received pairs. ``reps`` is ``[N, rho, 2, C, H, W]`` (any float
    dtype, on the training device); each epoch every sample contributes one of its rho pairs,
    drawn uniformly (spec A10), in batches of ``p.batch_pairs`` shuffled across clients. Both
    views go through the BN rServer module in one batch; NT-Xent (Eq. 7); LARS with linear
    warmup and cosine decay per step. Resumes from ``resume`` after a kill (same fingerprint)."""
    peak = scaled_peak_lr(p.lr, p.batch_pairs, p.lr_scaling)
    opt = LARS(
        lars_param_groups(model, p.weight_decay),
        lr=peak,
        momentum=p.momentum,
        trust_coefficient=p.trust_coefficient,
    )
    model.train()
    return run_epochs(
        p.epochs,
        partial(_rserver_epoch, model, opt, reps, p, peak),
        {"model": model, "opt": opt},
        resume,
        fingerprint,
        reps.device,
        "rServer",
        on_epoch,
    )


def _rserver_epoch(model: RServerModel, opt, reps: torch.Tensor, p, peak: float, epoch: int):
    """One epoch of :func:`train_rserver`: one drawn pair per sample, in a shuffled order."""
    device = reps.device
    n, rho = reps.shape[0], reps.shape[1]
    steps = rserver_steps(n, p.batch_pairs)
    total, warmup = steps * p.epochs, steps * p.warmup_epochs
    gen = torch_generator(torch.device("cpu"), p.seed, "rserver", epoch)
    order = torch.randperm(n, generator=gen)
    pick = torch.randint(rho, (n,), generator=gen)
    t0 = time.perf_counter()

    def batches():
        for s in range(steps):
            idx = order[s * p.batch_pairs : (s + 1) * p.batch_pairs]
            pair = reps[idx.to(device), pick[idx].to(device)].float()  # [B, 2, C, H, W]
            set_lr(opt, warmup_cosine(epoch * steps + s, total, warmup, peak))
            yield (torch.cat([pair[:, 0], pair[:, 1]]),)

    def loss(proj):
        return nt_xent(*proj.float().chunk(2), p.temperature)

    return {
        "epoch": epoch + 1,
        "loss": train_steps(opt, device, model, batches(), loss),
        "lr": warmup_cosine((epoch + 1) * steps - 1, total, warmup, peak),
        "seconds": round(time.perf_counter() - t0, 3),
    }


EPOCH_FIELDS = ["epoch", "loss", "lr"]  # timings go to the run record


def rserver(ctx: StepContext) -> None:
    """Phase 2b on the pairs of the clients that sent them; resumable per epoch."""
    p, export = ctx.exp.method, ctx.input("export")
    manifest = json.loads((export / "manifest.json").read_text())
    sent = [c["client"] for c in manifest["per_client"] if not c["dropped"]]
    log_path = ctx.results_dir / "rserver_epochs.tsv"
    reps = torch.cat([torch.from_numpy(np.load(export / f"client_{m}.npy")) for m in sent])
    reps = reps.to(ctx.device)
    model = build_rserver(p, reps.shape[3], ctx.device)

    def on_epoch(rows):
        write_tsv([{k: r[k] for k in EPOCH_FIELDS} for r in rows], log_path, EPOCH_FIELDS)
        print(
            f"epoch {rows[-1]['epoch']}/{p.rserver.epochs}: NT-Xent {rows[-1]['loss']:.4f}",
            flush=True,
        )

    log = train_rserver(model, reps, p.rserver, ctx.resume_path, ctx.fingerprint, on_epoch)
    write_tsv([{k: r[k] for k in EPOCH_FIELDS} for r in log], log_path, EPOCH_FIELDS)
    ctx.run_info["epoch_seconds"] = [r["seconds"] for r in log]
    torch_save(
        {"model": model.state_dict(), "in_channels": int(reps.shape[3])}, ctx.out / "model.pt"
    )
    ctx.info.update(
        samples=int(reps.shape[0]),
        clients=sent,
        epochs=len(log),
        loss=[round(r["loss"], 4) for r in log],
        parameters=sum(q.numel() for q in model.parameters()),
    )


def frozen_encoder(
    p, client_state: dict, rserver_state: dict, image_shape, device, projection: bool = False
) -> MfclEncoder:
    """The deployed MFCL model for feature extraction: client module + MaxPool + rServer module
    (+ head with ``projection``), frozen, BN in eval mode."""
    client = build_client_module(p, image_shape, device)
    client.load_state_dict(client_state)
    rs = build_rserver(p, client.rep_channels, device)
    rs.load_state_dict(rserver_state)
    return frozen(
        MfclEncoder(client, rs, projection=projection, tn_eval_pair=p.client_module.tn_eval_pair)
    )


def encoder_skeleton(p, image_shape, projection: bool = False) -> MfclEncoder:
    """The untrained module :func:`frozen_encoder` returns (for :mod:`fedssl.export`)."""
    client = build_client_module(p, image_shape, torch.device("cpu"))
    rs = build_rserver(p, client.rep_channels, torch.device("cpu"))
    return frozen(
        MfclEncoder(client, rs, projection=projection, tn_eval_pair=p.client_module.tn_eval_pair)
    )


def deployed_encoder(ctx: StepContext) -> MfclEncoder:
    """The frozen encoder from the phase-1 and rServer steps' outputs."""

    def load(step):
        return torch.load(ctx.input(step) / "model.pt", map_location=ctx.device, weights_only=True)

    client, rserver_ckpt = load("pretrain"), load("rserver")
    return frozen_encoder(
        ctx.exp.method,
        client["model"],
        rserver_ckpt["model"],
        client["image_shape"],
        ctx.device,
        ctx.exp.features.layer == "projection",
    )


def pre_pool_numel(model: ClientAutoencoder, image_shape) -> int:
    """|z| per view in the paper's Eq. 5 convention: the client module's map before the pool."""
    return math.prod(model.prepool_shape(*image_shape[1:]))
