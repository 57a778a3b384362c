"""The k-NN monitor: accuracy of the federation's global encoder every few rounds, logged into
the round log (``knn_monitor``; the untrained network's as ``knn_monitor_round0`` in round
1's row), so a run's accuracy can be read against its rounds, bytes and FLOPs. It is only
logged: the final model is evaluated, never the best-on-monitor one.

One monitor serves every method: it reads the model through a *feature function*, which turns
the federation's final model (:meth:`Strategy.final_model`) into an embedding of image
batches. :class:`ModuleFeatures` is that function for a model held as one module (the
encoder's output on a copy); a method whose model is not one module gives its own (MocoSFL's
split network: the synced client part, then the server's backbone).

It touches no random stream of the training: its bank (a class-stratified subset of the
clients' training images) and queries (of the test split, or the partition's server holdout)
come from seeds of their own, and the features are computed without gradients. Off by default
(``monitor_every: 0`` in a method's federation settings)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from fedssl.data import to_device
from fedssl.data.augment import to_float
from fedssl.data.partition import stratified_subset
from fedssl.eval.probes import knn_accuracy
from fedssl.params import KnnParams
from fedssl.stage.contract import StepContext
from fedssl.stage.runtime import derive_seed

BANK_SIZE = 5000  # labelled bank images, from the clients' training data
QUERY_SIZE = 2000  # query images, from the test split

Embedding = Callable[[torch.Tensor], torch.Tensor]  # float images [N, C, H, W] -> features
# the federation's final model (None: the model as built) -> its embedding
FeatureFn = Callable[[Any], Embedding]


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


class ModuleFeatures:
    """The feature function of a model held as one module: ``encoder(model)`` of a copy (the
    training's model is never touched), in eval mode, loaded with the final model's state
    dict."""

    def __init__(self, model: nn.Module, encoder: Callable[[nn.Module], nn.Module] = backbone_of):
        self.model = copy.deepcopy(model).eval()
        self.encoder = encoder(self.model)

    def __call__(self, state: dict[str, torch.Tensor] | None) -> Embedding:
        if state is not None:
            self.model.load_state_dict(state)
        return self.encoder


class KnnMonitor:
    """Weighted k-NN top-1 of the ``features`` of the federation's current model, on fixed
    queries against a fixed labelled bank, after every ``every``-th round and the last
    (``rounds``)."""

    def __init__(
        self,
        features: FeatureFn,
        bank: torch.Tensor,
        bank_labels: np.ndarray,
        queries: torch.Tensor,
        query_labels: np.ndarray,
        every: int,
        rounds: int,
        knn: KnnParams,
        batch_size: int = 512,
    ):
        self.features = features
        self.bank, self.bank_labels = bank, np.asarray(bank_labels)
        self.queries, self.query_labels = queries, np.asarray(query_labels)
        self.every, self.rounds, self.knn, self.batch_size = every, rounds, knn, batch_size
        self.start: float | None = None

    def due(self, round_: int) -> bool:
        """After round index ``round_`` (0-based)?"""
        return self.every > 0 and ((round_ + 1) % self.every == 0 or round_ + 1 == self.rounds)

    @torch.no_grad()
    def accuracy(self, model: Any = None) -> float:
        """k-NN top-1 % of the final model ``model`` (None: the model as built)."""
        embed = self.features(model)
        bank, queries = self._embed(embed, self.bank), self._embed(embed, self.queries)
        acc = knn_accuracy(
            bank, self.bank_labels, queries, self.query_labels, self.knn, self.bank.device
        )
        return round(acc["knn_top1"], 2)

    def _embed(self, embed: Embedding, images: torch.Tensor) -> np.ndarray:
        out = [
            embed(to_float(images[i : i + self.batch_size])).float()
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


def knn_monitor(ctx: StepContext, model: nn.Module, every: int, rounds: int, seed: int):
    """The monitor of a stage's federation of a module model: its bank from the clients'
    training images, its queries from the test split, with the experiment's k-NN settings (or
    the defaults), on the model's device."""
    knn = getattr(ctx.exp, "knn", None) or KnnParams()
    device = next(model.parameters()).device
    return monitor_of(ctx, ModuleFeatures(model), device, every, rounds, seed, knn)


def monitor_of(
    ctx: StepContext,
    features: FeatureFn,
    device,
    every: int,
    rounds: int,
    seed: int,
    knn: KnnParams,
    sizes: tuple[int, int] = (BANK_SIZE, QUERY_SIZE),
    queries: Literal["test", "holdout"] = "test",
) -> KnnMonitor:
    """A monitor on ``device`` reading ``features``: its bank (``sizes[0]`` images) from the
    clients' training images, its queries (``sizes[1]``) from the test split or the
    partition's server holdout, both class-stratified and seeded apart from the training."""
    images, labels = ctx.split("train")
    bank = _stratified(np.sort(np.concatenate(ctx.clients())), labels, sizes[0], seed, "bank")
    if queries == "holdout":
        q_images, q_labels = images, labels
        q_idx = _stratified(ctx.server_indices(), labels, sizes[1], seed, "queries")
    else:
        q_images, q_labels = ctx.split("test")
        q_idx = _stratified(np.arange(len(q_labels)), q_labels, sizes[1], seed, "queries")
    return KnnMonitor(
        features,
        to_device(images[bank], device),
        labels[bank],
        to_device(q_images[q_idx], device),
        q_labels[q_idx],
        every,
        rounds,
        knn,
    )


def _stratified(pool: np.ndarray, labels: np.ndarray, size: int, seed: int, what: str):
    """A class-stratified subset of the indices ``pool`` (at most ``size``), by the monitor's
    own seed for ``what``."""
    chosen = stratified_subset(
        labels[pool], min(size, len(pool)), derive_seed(seed, f"monitor-{what}")
    )
    return pool[chosen]
