"""The k-NN monitor: accuracy of the federation's global encoder every few rounds, logged into
the round log (``knn_monitor``; the untrained network's as ``knn_monitor_round0`` in round
1's row), so a run's accuracy can be read against its rounds, bytes and FLOPs. It is only
logged: the final model is evaluated, never the best-on-monitor one.

It touches no random stream of the training: its bank (a class-stratified subset of the
clients' training images) and queries (of the test split) come from seeds of their own, and
it extracts features from a copy of the model, in eval mode, without gradients. Off by
default (``monitor_every: 0`` in a method's federation settings)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from fedssl.data import to_device
from fedssl.data.augment import to_float
from fedssl.data.partition import stratified_subset
from fedssl.eval.probes import knn_accuracy
from fedssl.params import KnnParams
from fedssl.stage.runtime import derive_seed

BANK_SIZE = 5000  # labelled bank images, from the clients' training data
QUERY_SIZE = 2000  # query images, from the test split


# The encoder submodule's name in the library's models, in order of preference: a model with a
# ``backbone`` nests it under other names too (FedBYOL's ``encoder`` holds backbone and
# projector), so ``encoder`` is read only where neither of the first two is (the MoCo v3
# learners of the LW-FedSSL family, whose ``encoder`` is the ViT).
ENCODER_NAMES = (("backbone", "base"), ("encoder",))


def backbone_of(model: nn.Module) -> nn.Module:
    """The model's encoder: its first submodule named ``backbone`` (SimCLR's, BYOL's online
    one, Orchestra's, FeatARC's) or ``base`` (the supervised and personalised nets' D), else
    its first named ``encoder`` (the ViT learners')."""
    for names in ENCODER_NAMES:
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] in names:
                return module
    every = " or ".join(n for names in ENCODER_NAMES for n in names)
    raise ValueError(
        f"monitor_every: the k-NN monitor reads the model's encoder (a submodule named "
        f"{every}), and {type(model).__name__} has none (set monitor_every: 0)"
    )


class KnnMonitor:
    """Weighted k-NN top-1 of ``encoder(model)`` loaded with the federation's current model,
    on fixed queries against a fixed labelled bank, after every ``every``-th round and the
    last (``rounds``)."""

    def __init__(
        self,
        model: nn.Module,
        bank: torch.Tensor,
        bank_labels: np.ndarray,
        queries: torch.Tensor,
        query_labels: np.ndarray,
        every: int,
        rounds: int,
        knn: KnnParams,
        encoder: Callable[[nn.Module], nn.Module] = backbone_of,
        batch_size: int = 512,
    ):
        self.model = copy.deepcopy(model)  # the training's model is never touched
        self.encoder = encoder(self.model)
        self.bank, self.bank_labels = bank, np.asarray(bank_labels)
        self.queries, self.query_labels = queries, np.asarray(query_labels)
        self.every, self.rounds, self.knn, self.batch_size = every, rounds, knn, batch_size
        self.start: float | None = None

    def due(self, round_: int) -> bool:
        """After round index ``round_`` (0-based)?"""
        return self.every > 0 and ((round_ + 1) % self.every == 0 or round_ + 1 == self.rounds)

    @torch.no_grad()
    def accuracy(self, state: dict[str, torch.Tensor] | None = None) -> float:
        """k-NN top-1 % of the model with ``state`` loaded (None: as it is)."""
        if state is not None:
            self.model.load_state_dict(state)
        was_training = self.model.training
        self.model.eval()
        try:
            bank, queries = self._features(self.bank), self._features(self.queries)
        finally:
            self.model.train(was_training)
        acc = knn_accuracy(
            bank, self.bank_labels, queries, self.query_labels, self.knn, self.bank.device
        )
        return round(acc["knn_top1"], 2)

    def _features(self, images: torch.Tensor) -> np.ndarray:
        out = [
            self.encoder(to_float(images[i : i + self.batch_size])).float()
            for i in range(0, len(images), self.batch_size)
        ]
        return torch.cat(out).flatten(1).cpu().numpy()

    def __call__(self, fed, state, round_: int) -> dict:
        """The engine's hook (:attr:`fedssl.rounds.loop.Federation.monitor`): the round log's
        monitor columns after round index ``round_``."""
        out = {"knn_monitor_round0": self.start} if round_ == 0 and self.start is not None else {}
        if self.due(round_):
            out["knn_monitor"] = self.accuracy(fed.strategy.final_model(state))
        return out


def knn_monitor(ctx, model: nn.Module, every: int, rounds: int, seed: int) -> KnnMonitor:
    """The monitor of a stage's federation: its bank from the clients' training images, its
    queries from the test split (class-stratified, seeded apart from the training), with the
    experiment's k-NN settings (or the defaults), on the training's device."""
    images, labels = ctx.split("train")
    pool = np.sort(np.concatenate(ctx.clients()))
    bank = pool[
        stratified_subset(
            labels[pool], min(BANK_SIZE, len(pool)), derive_seed(seed, "monitor-bank")
        )
    ]
    test_images, test_labels = ctx.split("test")
    queries = stratified_subset(
        test_labels, min(QUERY_SIZE, len(test_labels)), derive_seed(seed, "monitor-queries")
    )
    device = next(model.parameters()).device
    return KnnMonitor(
        model,
        to_device(images[bank], device),
        labels[bank],
        to_device(test_images[queries], device),
        test_labels[queries],
        every,
        rounds,
        getattr(ctx.exp, "knn", None) or KnnParams(),
    )
