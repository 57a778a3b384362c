"""Fine-tuning a pretrained encoder end to end with a new linear head (the shared `finetune`
stage): AdamW, linear warmup then cosine decay per step, augmented training views, top-1 on the
untouched test split. Resumable per epoch (:func:`fedssl.training.epochs.run_epochs`)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedssl.data.augment import BatchAugment, to_float
from fedssl.params import FinetuneParams
from fedssl.stage.runtime import derive_seed, torch_generator
from fedssl.training.epochs import encoded, run_epochs, train_mode_batches, train_steps
from fedssl.training.optim import warmup_cosine


class Classifier(nn.Module):
    def __init__(self, encoder: nn.Module, dim: int, classes: int):
        super().__init__()
        self.encoder, self.head = encoder, nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(self.encoder(x))


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch: int) -> float:
    model.eval()
    starts = range(0, len(images), batch)
    batches = ((to_float(images[start : start + batch]),) for start in starts)
    correct = 0
    for start, logits in zip(starts, encoded(images.device, model, batches), strict=True):
        correct += (logits.argmax(1) == labels[start : start + batch]).sum().item()
    return 100.0 * correct / len(images)


def _cross_entropy(model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).float(), labels)


def _epoch(model, opt, augment, train, p: FinetuneParams, device, epoch: int) -> dict:
    """One epoch of AdamW steps in a seeded order, the rate warmed up then cosine-annealed by
    step over all epochs: the epoch's mean loss."""
    xtr, ytr = train
    steps = len(train_mode_batches(torch.arange(len(xtr)), p.batch_size))
    total, warmup = steps * p.epochs, steps * p.warmup_epochs
    model.train()
    gen = torch_generator(device, p.seed, "finetune", epoch)
    order = torch.randperm(
        len(xtr),
        generator=torch.Generator().manual_seed(derive_seed(p.seed, "finetune-order", epoch)),
    ).to(device)

    def batches():
        for i, idx in enumerate(train_mode_batches(order, p.batch_size)):
            for group in opt.param_groups:
                group["lr"] = warmup_cosine(epoch * steps + i, total, warmup, p.lr)
            yield model, augment(xtr[idx], gen), ytr[idx]

    loss = train_steps(opt, device, _cross_entropy, batches())
    return {"epoch": epoch + 1, "loss": round(loss, 5)}


def finetune(
    encoder: nn.Module,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    p: FinetuneParams,
    device: torch.device,
    resume: Path | None = None,
    fingerprint: str = "",
    on_epoch=None,
) -> dict:
    """Train ``encoder`` (unfrozen here) and a linear head on ``train`` (uint8 images, labels);
    returns the test top-1 (``finetune_top1``), the last epoch's training loss and the per-epoch
    log."""
    xtr = torch.from_numpy(np.array(train[0])).to(device)
    ytr = torch.from_numpy(np.array(train[1])).long().to(device)
    xte = torch.from_numpy(np.array(test[0])).to(device)
    yte = torch.from_numpy(np.array(test[1])).long().to(device)
    encoder.requires_grad_(True)
    with torch.no_grad():
        dim = encoder.eval()(to_float(xtr[:2])).shape[1]
    torch.manual_seed(derive_seed(p.seed, "finetune-head"))
    model = Classifier(encoder, dim, int(ytr.max()) + 1).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=p.lr, weight_decay=p.weight_decay)
    augment = BatchAugment(p.augment, xtr.shape[-1])
    log = run_epochs(
        p.epochs,
        partial(_epoch, model, opt, augment, (xtr, ytr), p, device),
        {"model": model, "opt": opt},
        resume,
        fingerprint,
        device,
        "fine-tune",
        on_epoch,
    )
    return {
        "finetune_top1": accuracy(model, xte, yte, 4 * p.batch_size),
        "finetune_train_top1": accuracy(model, xtr, ytr, 4 * p.batch_size),
        "finetune_loss": log[-1]["loss"] if log else None,
        "log": log,
    }
