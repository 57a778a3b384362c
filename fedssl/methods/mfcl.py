"""MFCL (modular federated contrastive learning, spec methods/mfcl.md).

Phase 1: clients train a small autoencoder (client module + mirror decoder, Twin/Group/Batch
Norm) on twin-ordered augmented views, averaged by the gServer with FedAvg (optionally through
pairwise-masked secure aggregation). Phase 2: each client exports rho pairs of twin views per
sample through the frozen client module + MaxPool, once; the rServer trains the remaining ResNet
stages + projection head on them with NT-Xent and LARS. Composes the shared augmentation, cohort
trainer, engine, secure aggregation masks, losses and optimiser."""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch
from torch.func import functional_call

from fedssl.data.augment import BatchAugment
from fedssl.fl.cohort import CohortTrainer, OptimizerConfig
from fedssl.fl.engine import Federation, FederationConfig, fedavg, plain_fedavg
from fedssl.fl.secure_agg import DEFAULT_MASK_STD, secure_fedavg
from fedssl.losses import nt_xent
from fedssl.models.autoencoder import (ClientAutoencoder, reconstruction_loss,
                                      resnet18_blocks_on_client)
from fedssl.models.rserver import MfclEncoder, RServerModel
from fedssl.optim import LARS, lars_param_groups, scaled_peak_lr, set_lr, warmup_cosine
from fedssl.runtime import derive_seed, numpy_rng, torch_generator, torch_save


def twin_batch(augment):
    """Two independent views of every sample, as one batch ordered [all view-1; all view-2]
    (rows k and k+K are twins, the layout Twin Norm expects)."""
    def make(batch: torch.Tensor, generator: torch.Generator):
        return augment(batch, generator), augment(batch, generator)
    return make


def autoencoder_loss(kind: str = "bce"):
    """Reconstruction of each augmented view from itself (Eq. 1). Padded samples of a short
    batch are dropped as whole pairs, so Twin Norm still sees intact twins."""
    def loss(model, params, buffers, views, valid):
        v1, v2 = views
        x = torch.cat([v1, v2])
        with torch.autocast(x.device.type, torch.bfloat16, enabled=x.device.type == "cuda"):
            logits = functional_call(model, (params, buffers), (x,))
        per_pixel = reconstruction_loss(logits.float(), model.reconstruction_target(x), kind,
                                        reduction="none")
        keep = torch.cat([valid, valid]).float()
        per_image = per_pixel.flatten(1).mean(1)
        return (per_image * keep).sum() / keep.sum().clamp(min=1)
    return loss


# ============================================================================ pipeline pieces
# Everything below composes the shared library (augmentation, CohortTrainer/Federation, secure
# aggregation masks, LARS, NT-Xent) into the stages of MFCL: phase 1, export, rServer, encoder.




def build_client_module(exp, image_shape, device) -> ClientAutoencoder:
    """The seeded initial client autoencoder of an MFCL experiment."""
    cm = exp.mfcl.client_module
    torch.manual_seed(derive_seed(exp.pretrain.seed, "init", "mfcl-client"))
    return ClientAutoencoder(cm.arch, in_channels=image_shape[0], width=cm.width, norm=cm.norm,
                             channels_per_group=cm.channels_per_group,
                             tn_variance=cm.tn_variance, ae_pool=cm.ae_pool,
                             cut=cm.cut).to(device)


def build_rserver(exp, in_channels: int, device) -> RServerModel:
    """The seeded initial rServer model: the ResNet blocks the client module's cut left over."""
    rs, cm = exp.mfcl.rserver, exp.mfcl.client_module
    torch.manual_seed(derive_seed(rs.seed, "init", "mfcl-rserver"))
    return RServerModel(cm.arch, in_channels, rs.width, rs.proj_hidden, rs.proj_dim,
                        skip_blocks=resnet18_blocks_on_client(cm.cut)).to(device)


def secure_aggregate(mask_std: float = DEFAULT_MASK_STD, session_secret: str = ""):
    """An engine aggregator: clients upload pairwise-masked, size-weighted states
    (:mod:`fedssl.fl.secure_agg`), so the gServer learns only their sum, hence the FedAvg mean.
    Integer buffers (BN batch counters) are aggregated in the clear, as plain FedAvg does."""
    def aggregate(stacked, weights, client_ids, round_):
        floats = {k: v for k, v in stacked.items() if v.is_floating_point()}
        out = fedavg({k: v for k, v in stacked.items() if k not in floats}, weights)
        n = len(client_ids)
        flat = torch.cat([v.reshape(n, -1).double() for v in floats.values()], 1)
        mean = secure_fedavg(list(flat), weights.tolist(), list(client_ids),
                             derive_seed("secure-agg", round_), mask_std, session_secret)
        start = 0
        for k, v in floats.items():
            size = v[0].numel()
            out[k] = mean[start:start + size].view(v.shape[1:]).to(v.device, v.dtype)
            start += size
        return out
    return aggregate


def make_phase1_federation(exp, model: ClientAutoencoder, clients: list[np.ndarray],
                           images: torch.Tensor, ckpt: Path, fingerprint: str) -> Federation:
    """Phase 1 (Alg. 1 l. 1-13): Adam on twin batches of K pairs, fresh optimizer state every
    round, size-weighted FedAvg of the whole autoencoder (optionally through secure
    aggregation)."""
    p1, pre = exp.mfcl.phase1, exp.pretrain
    trainer = CohortTrainer(
        model, twin_batch(BatchAugment(pre.augment, images.shape[-1])),
        autoencoder_loss(p1.loss), OptimizerConfig(kind="adam", eps=p1.adam_eps),
        batch_size=p1.batch_pairs, local_epochs=p1.local_epochs,
        parallel=pre.parallel_clients == "on" or (pre.parallel_clients == "auto"
                                                   and images.device.type == "cuda"))
    cfg = FederationConfig(rounds=p1.rounds, client_fraction=p1.client_fraction, lr=p1.lr,
                           seed=pre.seed)
    aggregate = secure_aggregate() if p1.secure_aggregation else plain_fedavg
    return Federation(trainer, clients, images, cfg, ckpt, fingerprint, aggregate)


# ---------------------------------------------------------------------------- export
def dropped_clients(num_clients: int, dropout: float, seed: int) -> list[int]:
    """Fig. 8: round(δ·M) clients (at least one kept), drawn once from the seed, send nothing."""
    k = min(num_clients - 1, round(dropout * num_clients))
    return sorted(numpy_rng(seed, "export-dropout").choice(num_clients, k, replace=False).tolist())


def encode_pair(model: ClientAutoencoder, v1: torch.Tensor, v2: torch.Tensor,
                tn_pairing: str = "twin") -> torch.Tensor:
    """Both views of a batch through the client module and its pool, ``[2K, C, h, w]``. Twin
    Norm normalises each sample's two views jointly, or with ``tn_pairing='self'`` each view
    paired with itself, so that the two views share no statistics (an ablation)."""
    if tn_pairing == "self" and model.norm_kind == "tn":
        return torch.cat([model.encode(torch.cat([v, v]))[:len(v)] for v in (v1, v2)])
    return model.encode(torch.cat([v1, v2]))


@torch.no_grad()
def export_client(model: ClientAutoencoder, images: torch.Tensor, indices: np.ndarray,
                  augment: BatchAugment, pairs: int, batch: int, seed: int, client: int,
                  bn_mode: str = "eval", tn_pairing: str = "twin") -> torch.Tensor:
    """What client ``client`` sends to the rServer: for every local sample, ``pairs`` pairs of
    twin views through the frozen client module and its MaxPool, as fp16
    ``[n, pairs, 2, C, h, w]`` (``model.encode``'s output: H/2 × W/2, or H/4 × W/4 for a cut
    holding the stride-2 conv). Twin Norm pairs the two views of each sample again. Each
    (client, pair, chunk) draws its views from its own seeded generator."""
    model.train(bn_mode == "train")
    out = None
    idx_all = torch.from_numpy(np.asarray(indices)).to(images.device)
    for r in range(pairs):
        for j, start in enumerate(range(0, len(indices), batch)):
            x = images[idx_all[start:start + batch]]
            gen = torch_generator(images.device, seed, "export", client, r, j)
            v1, v2 = twin_batch(augment)(x, gen)
            with torch.autocast(x.device.type, torch.bfloat16, enabled=x.device.type == "cuda"):
                z = encode_pair(model, v1, v2, tn_pairing).to(torch.float16)
            if out is None:
                out = torch.empty((len(indices), pairs, 2, *z.shape[1:]), dtype=torch.float16,
                                  device="cpu")
            out[start:start + len(x), r] = torch.stack(z.chunk(2), 1).cpu()
    model.eval()
    return out


# ---------------------------------------------------------------------------- rServer
def rserver_steps(num_samples: int, batch_pairs: int) -> int:
    """Steps per epoch: full batches only (as SimCLR), or one batch when there are fewer."""
    return max(1, num_samples // batch_pairs)


def train_rserver(model: RServerModel, reps: torch.Tensor, p, resume: Path | None = None,
                  fingerprint: str = "", on_epoch=None) -> list[dict]:
    """Phase 2b: SimCLR on the received pairs. ``reps`` is ``[N, rho, 2, C, H, W]`` (any float
    dtype, on the training device); each epoch every sample contributes one of its rho pairs,
    drawn uniformly (spec A10), in batches of ``p.batch_pairs`` shuffled across clients. Both
    views go through the BN rServer module in one batch; NT-Xent (Eq. 7); LARS with linear
    warmup and cosine decay per step. Resumes from ``resume`` after a kill (same fingerprint)."""
    device = reps.device
    n, rho = reps.shape[0], reps.shape[1]
    steps = rserver_steps(n, p.batch_pairs)
    total, warmup = steps * p.epochs, steps * p.warmup_epochs
    peak = scaled_peak_lr(p.lr, p.batch_pairs, p.lr_scaling)
    opt = LARS(lars_param_groups(model, p.weight_decay), lr=peak, momentum=p.momentum,
               trust_coefficient=p.trust_coefficient)
    log, first = [], 0
    if resume is not None and resume.exists():
        ck = torch.load(resume, map_location=device, weights_only=False)
        if ck.get("fingerprint") == fingerprint:
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["opt"])
            log, first = ck["log"], ck["epoch"]
    model.train()
    for epoch in range(first, p.epochs):
        gen = torch_generator(torch.device("cpu"), p.seed, "rserver", epoch)
        order = torch.randperm(n, generator=gen)
        pick = torch.randint(rho, (n,), generator=gen)
        loss_sum, t0 = 0.0, time.perf_counter()
        for s in range(steps):
            idx = order[s * p.batch_pairs:(s + 1) * p.batch_pairs]
            pair = reps[idx.to(device), pick[idx].to(device)].float()  # [B, 2, C, H, W]
            set_lr(opt, warmup_cosine(epoch * steps + s, total, warmup, peak))
            with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
                proj = model(torch.cat([pair[:, 0], pair[:, 1]]))
            loss = nt_xent(*proj.float().chunk(2), p.temperature)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.item()
        log.append({"epoch": epoch + 1, "loss": loss_sum / steps,
                    "lr": warmup_cosine((epoch + 1) * steps - 1, total, warmup, peak),
                    "seconds": round(time.perf_counter() - t0, 3)})
        if resume is not None:
            torch_save({"fingerprint": fingerprint, "epoch": epoch + 1, "log": log,
                        "model": model.state_dict(), "opt": opt.state_dict()}, resume)
        if on_epoch:
            on_epoch(log)
    return log


def frozen_encoder(exp, client_state: dict, rserver_state: dict, image_shape,
                   device) -> MfclEncoder:
    """The deployed MFCL model for feature extraction: client module + MaxPool + rServer module
    (+ head when ``features.layer`` is projection), frozen, BN in eval mode."""
    client = build_client_module(exp, image_shape, device)
    client.load_state_dict(client_state)
    rserver = build_rserver(exp, client.rep_channels, device)
    rserver.load_state_dict(rserver_state)
    enc = MfclEncoder(client, rserver, projection=exp.features.layer == "projection",
                      tn_eval_pair=exp.mfcl.client_module.tn_eval_pair).eval()
    for q in enc.parameters():
        q.requires_grad_(False)
    return enc


def pre_pool_numel(model: ClientAutoencoder, image_shape) -> int:
    """|z| per view in the paper's Eq. 5 convention: the client module's map before the pool."""
    return math.prod(model.prepool_shape(*image_shape[1:]))


__all__ = ["twin_batch", "autoencoder_loss", "build_client_module", "build_rserver",
           "secure_aggregate", "make_phase1_federation", "dropped_clients", "encode_pair", "export_client",
           "rserver_steps", "train_rserver", "frozen_encoder", "pre_pool_numel"]
