"""Personalised evaluation: every client's own model on its own test split (the same class mix
as its training data), every round, or on a sparser schedule where a method's params ask for
one (:func:`evaluated_round`: at 100 clients a round's evaluation costs several times its
training).

A method's strategy measures the clients in its ``evaluate`` hook with :func:`client_outputs`
and keeps the record in ``FedState.memo`` through :class:`PersonalLog` (so a resumed run keeps
it); at the end the step writes ``personal.npz``. The shared ``personal`` stage turns that file
into metrics (:func:`summarize`): mean accuracy at fractions of the rounds, over the last rounds
and at its best, rounds to a target, pooled F1 and AUROC of the final models, and, when the
clients chose among models, how well those choices recover the true groups."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedssl.data import load_npz
from fedssl.eval.metrics import classification_metrics, cluster_metrics

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

MEMO_KEY = "personal"
VAL_KEY = "val_accuracy"  # personal.npz: each final model's accuracy on its validation images


def evaluated_round(round_: int, rounds: int, every: int) -> bool:
    """Whether round ``round_`` (0-based) of a run of ``rounds`` is evaluated when a method
    evaluates every ``every``-th round: those, and each of the last ``every`` rounds, so that
    a mean over up to the last ``every`` rounds reads every one of them."""
    number = round_ + 1
    return number % every == 0 or number > rounds - every


class PersonalLog:
    """Per-evaluated-round, per-client accuracy (and model choice) kept in ``memo``, with the
    rounds they were measured at, plus the final round's pooled class probabilities."""

    def __init__(self, memo: dict):
        self.memo = memo.setdefault(MEMO_KEY, {"accuracy": [], "choice": []})
        # a record kept before the rounds were (every round evaluated): 1, 2, ...
        self.memo.setdefault("rounds", list(range(1, len(self.memo["accuracy"]) + 1)))

    def record(
        self, accuracy: list[float], choice: list[int] | None = None, number: int | None = None
    ) -> dict:
        """One round: each client's test accuracy (%) and, optionally, the model it chose;
        ``number``: the round's (1-based; none: the next after the last recorded). Returns
        the round log's columns."""
        self.memo["accuracy"].append([float(a) for a in accuracy])
        self.memo["rounds"].append(number or (self.memo["rounds"] or [0])[-1] + 1)
        if choice is not None:
            self.memo["choice"].append([int(c) for c in choice])
        return {"personal_acc": round(float(np.mean(accuracy)), 3)}

    def save(
        self,
        path: Path,
        labels: list[np.ndarray],
        probs: list[np.ndarray],
        val_accuracy: list[float] | None = None,
    ) -> None:
        """Write the record with the final models' outputs (one array per client) and, where
        the partition has validation images, each final model's accuracy (%) on its own."""
        choice = np.asarray(self.memo["choice"], dtype=np.int64)
        val = {} if val_accuracy is None else {VAL_KEY: np.asarray(val_accuracy, np.float64)}
        np.savez(
            path,
            accuracy=np.asarray(self.memo["accuracy"], dtype=np.float64),
            rounds=np.asarray(self.memo["rounds"], dtype=np.int64),
            choice=choice.reshape(len(self.memo["choice"]), -1)
            if choice.size
            else np.zeros((0, 0), dtype=np.int64),  # no model choices recorded
            labels=np.concatenate(labels),
            probs=np.concatenate(probs),
            client=np.concatenate([np.full(len(y), i) for i, y in enumerate(labels)]),
            **val,
        )


def validation_images(ctx: StepContext) -> tuple | None:
    """The partition's per-client validation images (``client_tests.validation_per_client``)
    for :func:`client_outputs`: (those training images on the device, their labels, each
    client's indices into them); None when the partition has none."""
    import torch

    from fedssl.data import to_device

    clients = ctx.client_validation()
    if clients is None:
        return None
    used = np.unique(np.concatenate(clients))
    images, labels = ctx.split("train")
    return (
        to_device(np.asarray(images[used]), ctx.device),
        torch.as_tensor(np.asarray(labels[used]), dtype=torch.int64, device=ctx.device),
        [np.searchsorted(used, c) for c in clients],
    )


def validation_accuracy(logits_of: Callable, validation: tuple | None) -> list[float] | None:
    """Each client's model (``logits_of``, as :func:`client_outputs`') on its validation
    images, accuracy %; None without them."""
    return None if validation is None else client_outputs(logits_of, *validation)[0]


def client_outputs(
    logits_of: Callable, images, labels, tests: list[np.ndarray], batch: int = 1024
) -> tuple[list[float], list[np.ndarray], list[np.ndarray]]:
    """Each client's model on its test indices: accuracy (%), true labels, softmax outputs.
    ``logits_of(client, float_images)`` runs that client's model (no grad, eval mode)."""
    import torch

    from fedssl.data.augment import to_float

    accs, ys, ps = [], [], []
    with torch.no_grad():
        for client, idx in enumerate(tests):
            idx_t = torch.as_tensor(idx, device=images.device)
            out = [
                logits_of(client, to_float(images[idx_t[s : s + batch]])).float()
                for s in range(0, len(idx_t), batch)
            ]
            probs = torch.cat(out).softmax(1).cpu().numpy()
            y = labels[idx_t].cpu().numpy()
            accs.append(100.0 * float((probs.argmax(1) == y).mean()) if len(y) else 0.0)
            ys.append(y)
            ps.append(probs)
    return accs, ys, ps


def summarize(npz_path: Path, p, true_groups: list[int] | None = None) -> dict:
    """Metrics of a ``personal.npz`` under :class:`~fedssl.params.PersonalEvalParams` ``p``:
    over the rounds it evaluated (every round, in a record without ``rounds``); a checkpoint
    reads the last evaluated round up to it."""
    z = load_npz(npz_path, ("accuracy", "choice", "labels", "probs"), optional=("rounds",))
    acc, choice, labels, probs = z["accuracy"], z["choice"], z["labels"], z["probs"]
    mean = acc.mean(1)  # per evaluated round, over clients
    at = z["rounds"] if "rounds" in z else np.arange(1, len(mean) + 1)
    rounds = int(at[-1])
    out = {
        "personal_top1": round(float(mean[-1]), 2),
        **_validation(npz_path),
        f"personal_last{p.last_rounds}": _last_rounds(mean, at, rounds, p.last_rounds),
        "personal_best": round(float(mean.max()), 2),
        "rounds": rounds,
    }
    for f in p.checkpoints:
        r = max(1, round(f * rounds))
        out[f"personal_at_{r}"] = round(float(mean[at <= r][-1]), 2)
        # as if the run had stopped at round r (a paper's column of a shorter run)
        window = (at <= r) & (at > r - p.last_rounds)
        out[f"personal_last{p.last_rounds}_at_{r}"] = round(float(mean[window].mean()), 2)
    if p.target is not None:
        hit = np.flatnonzero(mean >= p.target)
        out["rounds_to_target"] = int(at[hit[0]]) if hit.size else None
    pooled = classification_metrics(labels, probs)
    pooled["pooled_top1"] = pooled.pop("accuracy")
    out.update({k: round(float(v), 4) for k, v in pooled.items()})
    if choice.size:
        out.update(_clusters(choice, true_groups))
    return out


def _last_rounds(mean: np.ndarray, at: np.ndarray, rounds: int, last: int) -> float:
    """The clients' mean accuracy averaged over the run's last ``last`` rounds, each of
    which the record must hold."""
    held = at > rounds - last
    if held.sum() != min(last, rounds):
        raise ValueError(
            f"personal.last_rounds: {last}, but the record holds {int(held.sum())} of the "
            f"run's last {last} rounds (its method evaluated a sparser schedule)"
        )
    return round(float(mean[held].mean()), 2)


def _validation(npz_path: Path) -> dict:
    """``personal_top1_val``: the final models' mean accuracy on their validation images, as
    ``personal_top1`` is on their test images (absent when the record has none)."""
    found = load_npz(npz_path, (), optional=(VAL_KEY,))
    if not found:
        return {}
    return {"personal_top1_val": round(float(found[VAL_KEY].mean()), 2)}


def _clusters(choice: np.ndarray, true_groups: list[int] | None) -> dict:
    """Which models the clients chose in the last round and, against the true groups, how well
    (ARI, purity) and from which round on the groups were found for good (ARI = 1 to the end)."""
    if true_groups is None:
        return {"clusters_used": int(len(np.unique(choice[-1])))}
    out = {
        k: (round(float(v), 4) if isinstance(v, float) else v)
        for k, v in cluster_metrics(choice[-1], true_groups).items()
    }
    found = [cluster_metrics(c, true_groups)["ari"] >= 1.0 - 1e-9 for c in choice]
    last_miss = max((r for r, ok in enumerate(found) if not ok), default=-1)
    out["groups_found_at"] = last_miss + 2 if last_miss + 1 < len(found) else None
    return out
