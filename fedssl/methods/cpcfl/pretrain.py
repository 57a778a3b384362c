"""CP-CFL step ``pretrain``: centralised SSL on the server's public unlabelled data (Alg. 1),
one encoder per projector-width candidate, the best picked by the shared linear probe (§4.1).
No client takes part and nothing is communicated. Resumes from its last finished epoch."""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedssl.data import to_device
from fedssl.data.augment import BatchAugment, multi_view
from fedssl.data.partition import stratified_subset
from fedssl.eval.probes import extract_features, linear_probe
from fedssl.fl.state import TIMING_FIELDS
from fedssl.methods.cpcfl import PAPER_PROJ_WIDTH, SSL_KINDS
from fedssl.methods.cpcfl.models import Encoder, SSLNet, seeded
from fedssl.stage.runtime import numpy_rng, torch_generator, torch_save, write_json, write_tsv
from fedssl.training.epochs import run_epochs, train_steps

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

ENCODER_FILE, PUBLIC_FILE = "encoder.pt", "public.npy"
# the committed log holds what the inputs determine; the epochs' timings go to the run record
LOG_FIELDS = ["width", "epoch", "loss"]


def public_indices(ctx: StepContext, public) -> np.ndarray:
    """The public set: indices into its split (``public.split``)."""
    _, labels = ctx.split(public.split)
    if public.split == "train":
        return stratified_subset(labels, public.size, public.seed)
    if public.size is None or public.size >= len(labels):
        return np.arange(len(labels))
    return np.sort(numpy_rng(public.seed, "public").choice(len(labels), public.size, replace=False))


def widths_of(p) -> tuple[int, ...]:
    return p.ssl.proj_widths or (PAPER_PROJ_WIDTH[p.pretrain],)


def build_ssl_net(p, width: int, image_shape, device) -> SSLNet:
    s = p.ssl
    return seeded(
        lambda: SSLNet(
            p.pretrain,
            Encoder(p.encoder, image_shape),
            width,
            s.predictor_hidden,
            s.temperature,
            s.ema,
        ),
        s.seed,
        "ssl-init",
        p.pretrain,
        width,
    ).to(device)


def train_candidate(
    p,
    width: int,
    images: torch.Tensor,
    image_shape,
    device,
    ckpt,
    fingerprint: str,
    log: list[dict],
) -> SSLNet:
    """E_p epochs of the SSL loss on ``images`` (uint8, on ``device``) with Adam; batches are
    seeded shuffles with the last short batch dropped (BN in the heads needs full batches)."""
    s = p.ssl
    net = build_ssl_net(p, width, image_shape, device)
    opt = torch.optim.Adam([q for m in net.online() for q in m.parameters()], lr=s.lr)
    two_views = multi_view(BatchAugment(s.augment, image_shape[-1]), views=2)
    n = len(images)
    batch = min(s.batch_size, n)
    net.train()

    def one_epoch(epoch: int) -> dict:
        t0 = time.perf_counter()
        order = torch.from_numpy(numpy_rng(s.seed, "ssl-order", width, epoch).permutation(n))
        gen = torch_generator(device, s.seed, "ssl-augment", width, epoch)
        batches = (images[order[b * batch : (b + 1) * batch].to(device)] for b in range(n // batch))
        mean_loss = _ssl_epoch(net, opt, two_views, batches, gen, device)
        seconds = time.perf_counter() - t0
        return {
            "width": width,
            "epoch": epoch + 1,
            "loss": round(mean_loss, 5),
            "seconds": round(seconds, 2),
            "images_per_s": round(n // batch * batch / seconds, 1),
        }

    log += run_epochs(
        s.epochs,
        one_epoch,
        {"net": net, "opt": opt},
        ckpt,
        fingerprint,
        device,
        f"width {width}",
        partial(_say_epoch, p, width),
    )
    return net


def _say_epoch(p, width: int, rows: list[dict]) -> None:
    row = rows[-1]
    print(
        f"{p.pretrain} width {width} epoch {row['epoch']}/{p.ssl.epochs}: loss "
        f"{row['loss']:.4f} ({row['images_per_s']:.0f} img/s)",
        flush=True,
    )


def _ssl_epoch(net: SSLNet, opt, two_views, batches, gen, device) -> float:
    """One epoch of Adam steps of the SSL loss on two views of each batch: the mean loss."""
    views = (two_views(x, gen) for x in batches)
    return train_steps(opt, device, net.loss, views, after_step=net.after_step)


def _subset(labels: np.ndarray, size: int | None, seed: int) -> np.ndarray:
    if size is None or size >= len(labels):
        return np.arange(len(labels))
    return stratified_subset(labels, size, seed)


def linear_eval(ctx: StepContext, encoder, le, public_idx: np.ndarray, device) -> dict:
    """The shared linear probe on the frozen encoder: trained on the proxy's labels (the public
    slice's, or the labelled training split), tested on the test split."""
    train_images, train_labels = ctx.split("train")
    if le.proxy == "public":
        idx = public_idx[_subset(train_labels[public_idx], le.train_size, le.probe.seed)]
    else:
        idx = _subset(train_labels, le.train_size, le.probe.seed)
    test_images, test_labels = ctx.split("test")
    test_idx = _subset(test_labels, le.test_size, le.probe.seed + 1)
    was_training = encoder.training
    tr = extract_features(encoder, np.asarray(train_images[np.sort(idx)]), 1024, device)
    te = extract_features(encoder, np.asarray(test_images[test_idx]), 1024, device)
    encoder.train(was_training)
    return linear_probe(tr, train_labels[np.sort(idx)], te, test_labels[test_idx], le.probe, device)


def _scored(
    ctx: StepContext, net: SSLNet, width: int, log: list[dict], public_idx: np.ndarray
) -> dict:
    """A candidate's row: the linear probe of its encoder (trained on the public slice where
    that is of the training split) and its final SSL loss."""
    s = ctx.exp.method.ssl
    public = public_idx if s.public.split == "train" else np.empty(0, np.int64)
    probe = linear_eval(ctx, net.encoder, s.linear_eval, public, ctx.device)
    final = [r["loss"] for r in log if r["width"] == width][-1]
    print(f"width {width}: linear probe {probe['linear_top1']:.2f}%", flush=True)
    return {"width": width, "linear_top1": round(probe["linear_top1"], 2), "final_loss": final}


def run(ctx: StepContext) -> None:
    p = ctx.exp.method
    log: list[dict] = []
    log_path = ctx.results_dir / "ssl_epochs.tsv"
    if p.pretrain not in SSL_KINDS:  # nothing to pretrain on the server
        write_tsv([], log_path, LOG_FIELDS)
        ctx.info.update(pretrain=p.pretrain, epochs=0)
        return
    s = p.ssl
    device = ctx.device
    public_idx = public_indices(ctx, s.public)
    images, _ = ctx.split(s.public.split)
    data = to_device(np.asarray(images[public_idx]), device)
    shape = tuple(data.shape[1:])
    candidates, nets = [], {}
    for width in widths_of(p):
        ckpt = ctx.resume_path.with_name(f"{ctx.resume_path.stem}.w{width}.pt")
        net = train_candidate(p, width, data, shape, device, ckpt, ctx.fingerprint, log)
        write_tsv([{k: r[k] for k in LOG_FIELDS} for r in log], log_path, LOG_FIELDS)
        candidates.append(_scored(ctx, net, width, log, public_idx))
        nets[width] = net
    best = max(candidates, key=lambda c: c["linear_top1"])  # first of the best on ties
    torch_save(
        {
            "encoder": nets[best["width"]].encoder.state_dict(),
            "kind": p.pretrain,
            "width": best["width"],
            "image_shape": shape,
        },
        ctx.out / ENCODER_FILE,
    )
    np.save(ctx.out / PUBLIC_FILE, public_idx)
    write_json(ctx.out / "selection.json", {"candidates": candidates, "chosen": best})
    ctx.info.update(
        pretrain=p.pretrain,
        epochs=s.epochs,
        public_images=int(len(public_idx)),
        chosen_width=best["width"],
        linear_top1=best["linear_top1"],
        encoder_parameters=sum(q.numel() for q in nets[best["width"]].encoder.parameters()),
    )
    ctx.run_info["epochs"] = [{k: r[k] for k in ("width", "epoch", *TIMING_FIELDS)} for r in log]
    for width in widths_of(p):
        ctx.resume_path.with_name(f"{ctx.resume_path.stem}.w{width}.pt").unlink(missing_ok=True)
