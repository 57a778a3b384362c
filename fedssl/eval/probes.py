"""Evaluation of a frozen encoder: feature extraction, linear probe and weighted k-NN."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedssl.data.augment import to_float
from fedssl.params import KnnParams, LinearProbeParams
from fedssl.stage.progress import Progress, advance
from fedssl.stage.runtime import derive_seed
from fedssl.training.epochs import encoded


@torch.no_grad()
def extract_features(
    encoder: nn.Module,
    images: np.ndarray,
    batch_size: int,
    device: torch.device,
    desc: str = "features",
) -> np.ndarray:
    """Encoder outputs for uint8 images (no augmentation, eval mode), as float32 numpy."""
    encoder.eval()
    out = []
    with Progress(desc, len(images)):
        for z in encoded(device, encoder, _batches(images, batch_size, device)):
            out.append(z.float().cpu())
            advance(len(z))
    return torch.cat(out).numpy()


def _batches(images: np.ndarray, batch_size: int, device: torch.device):
    for start in range(0, len(images), batch_size):
        yield (to_float(torch.from_numpy(np.array(images[start : start + batch_size])).to(device)),)


def linear_probe(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    p: LinearProbeParams,
    device: torch.device,
    curve: list[dict] | None = None,
    predicted: dict[str, np.ndarray] | None = None,
    val: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict:
    """Multinomial logistic regression on fixed features (Adam, cosine schedule). When
    ``curve`` is a list, one row per epoch is appended to it: the epoch's mean training loss
    and the test top-1 after it (the probe's learning curve; measuring it changes nothing).
    When ``predicted`` is a dict, ``predicted["linear_top1"]`` (the metric's key) is set to
    each test image's predicted class (the board's per-image input; it changes nothing).
    ``val``: (features, labels) of a validation split the fitted probe also scores
    (``linear_top1_val``), standardised with the training statistics; it changes nothing."""
    xtr, xte = (torch.from_numpy(a).float().to(device) for a in (train_x, test_x))
    ytr, yte = (torch.from_numpy(a).long().to(device) for a in (train_y, test_y))
    scale = _scaler(xtr, p.standardize)
    xtr, xte = scale(xtr), scale(xte)
    gen = torch.Generator().manual_seed(derive_seed(p.seed, "probe"))
    clf = _seeded_linear(xtr.shape[1], int(ytr.max()) + 1, gen, device)
    opt = torch.optim.Adam(clf.parameters(), lr=p.lr, weight_decay=p.weight_decay)
    steps_per_epoch = -(-len(xtr) // p.batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, p.epochs * steps_per_epoch)
    with Progress("linear probe", p.epochs * len(xtr)):
        for epoch in range(p.epochs):
            order = torch.randperm(len(xtr), generator=gen).to(device)
            loss_sum = torch.zeros((), device=device)
            for idx in order.split(p.batch_size):
                loss = F.cross_entropy(clf(xtr[idx]), ytr[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                loss_sum += loss.detach()
                advance(len(idx))
            if curve is not None:
                curve.append(_curve_row(epoch, loss_sum.item() / steps_per_epoch, clf, xte, yte))
    train_acc, test_acc = _accuracy(clf, xtr, ytr), _accuracy(clf, xte, yte, predicted)
    out = {"linear_top1": 100 * test_acc, "linear_train_top1": 100 * train_acc}
    if val is not None:
        xva, yva = torch.from_numpy(val[0]).float().to(device), torch.from_numpy(val[1]).long()
        out["linear_top1_val"] = 100 * _accuracy(clf, scale(xva), yva.to(device))
    return out


def _curve_row(epoch: int, loss: float, clf: nn.Module, xte, yte) -> dict:
    """The probe's learning curve after an epoch: its mean training loss and test top-1."""
    return {
        "epoch": epoch + 1,
        "loss": round(loss, 5),
        "test_top1": round(100 * _accuracy(clf, xte, yte), 2),
    }


def _scaler(xtr: torch.Tensor, standardize: bool):
    """Features z-scored with the training features' statistics (or left as they are)."""
    if not standardize:
        return lambda x: x
    mean, std = xtr.mean(0), xtr.std(0).clamp(min=1e-6)
    return lambda x: (x - mean) / std


def _seeded_linear(dim: int, classes: int, gen: torch.Generator, device) -> nn.Linear:
    clf = nn.Linear(dim, classes).to(device)
    with torch.no_grad():
        clf.weight.copy_(torch.randn(clf.weight.shape, generator=gen) * 0.01)
        clf.bias.zero_()
    return clf


@torch.no_grad()
def _accuracy(clf: nn.Module, x: torch.Tensor, y: torch.Tensor, predicted=None) -> float:
    """Top-1 of ``clf`` on (x, y), each image's class into ``predicted["linear_top1"]``."""
    guess = clf(x).argmax(1)
    if predicted is not None:
        predicted["linear_top1"] = guess.cpu().numpy()
    return (guess == y).float().mean().item()


@torch.no_grad()
def knn_accuracy(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    p: KnnParams,
    device: torch.device,
    chunk: int = 1024,
    predicted: dict[str, np.ndarray] | None = None,
) -> dict:
    """Weighted k-NN on cosine similarity: each of the k neighbours votes exp(sim / T).
    ``predicted``: as :func:`linear_probe`'s, its ``"knn_top1"`` set."""
    bank = F.normalize(torch.from_numpy(train_x).float().to(device), dim=1)
    labels = torch.from_numpy(train_y).long().to(device)
    num_classes = int(labels.max()) + 1
    guesses = []
    for start in range(0, len(test_x), chunk):
        q = F.normalize(torch.from_numpy(test_x[start : start + chunk]).float().to(device), dim=1)
        sim, idx = (q @ bank.T).topk(min(p.k, len(bank)), dim=1)
        votes = torch.zeros(len(q), num_classes, device=device)
        votes.scatter_add_(1, labels[idx], (sim / p.temperature).exp())
        guesses.append(votes.argmax(1).cpu())
    guess = torch.cat(guesses).numpy() if guesses else np.zeros(0, dtype=np.int64)
    if predicted is not None:
        predicted["knn_top1"] = guess
    correct = int((guess == np.asarray(test_y)).sum())
    return {"knn_top1": 100 * correct / len(test_x)}
