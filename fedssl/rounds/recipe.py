"""A federated method's recipe and the one builder that turns it into a :class:`Federation`.

A method says *what* its clients train (:class:`Recipe`: the strategy, one :class:`Local`
pass or several phases, or a trainer of its own such as split learning's); the builder says
*how*, the same way for every method: the strategy is built first (with the params'
``strategy:`` choice stacked over it, :func:`fedssl.strategies.compose.chosen_over`), then
each pass's cohort trainer, whose loss is wrapped by the strategy's ``local_objective``
(FedProx's proximal term composes with any method) and whose forward runs under the
precision policy (one autocast region per forward, :func:`fedssl.fl.cohort.forward`; a
method never calls the policy).

A pass's loss comes in one of two shapes: a pure ``loss(outputs, batch)`` of the model's
outputs (by default of ``model(cat(views))``, or of a method's ``forward(model, weights,
batch)`` when one forward is not enough, e.g. a frozen branch in the same precision region),
or a ``step_loss(model, params, buffers, batch)`` for a method whose passes differ in what
they forward (it calls :func:`fedssl.fl.cohort.forward` itself).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from fedssl.fl.cohort import (
    Batch,
    CohortTrainer,
    LocalData,
    LossFn,
    OptimizerConfig,
    Tensors,
    ViewFn,
    on_outputs,
    vectorise_clients,
)
from fedssl.fl.state import FederationConfig, FedState, RoundUpdates
from fedssl.rounds.loop import Federation, LocalTraining, MonitorOf, Phase
from fedssl.strategies.base import Strategy
from fedssl.strategies.compose import chosen_over

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

# (outputs, batch) -> scalar: outputs in fp32 from the default forward, as computed otherwise
OutputLoss = Callable[[Any, Batch], torch.Tensor]
# (model, (params, buffers), batch) -> outputs; the builder runs it under the precision policy
Forward = Callable[[nn.Module, tuple[Tensors, Tensors], Batch], Any]
AfterStep = Callable[[Tensors, Tensors, Tensors], None]  # (trained, frozen, buffers)


class RoundTrainer(Protocol):
    """What trains a federation's round (:class:`LocalTraining`, or split learning's trainer
    where clients and server step together every batch)."""

    def train_round(
        self, fed: Federation, state: FedState, chosen: list[int], round_: int, lr: float
    ) -> RoundUpdates: ...


@dataclass(frozen=True)
class Local:
    """One pass of the clients' local training: its views (a builder of the image size), its
    loss (``loss`` with an optional ``forward``, or a ``step_loss``), the optimiser, batch
    size and epochs, an ``after_step`` builder of the model (a momentum target's EMA). As a
    phase of several: which parameters it trains (``trainable(state)``; None: the
    strategy's), its batch draws' ``seed_tag`` and its ``loss_weight`` (see
    :class:`fedssl.rounds.loop.Phase`). ``own_objective``: the loss already holds what the
    strategy's local objective would add (a personalised baseline that builds its SCAFFOLD
    correction from a companion network), so the builder does not wrap it again."""

    views: Callable[[int], ViewFn]
    batch_size: int
    local_epochs: int
    optimizer: OptimizerConfig = OptimizerConfig()
    loss: OutputLoss | None = None
    forward: Forward | None = None
    step_loss: LossFn | None = None
    after_step: Callable[[nn.Module], AfterStep] | None = None
    trainable: Callable[[FedState], set[str] | None] | None = None
    seed_tag: tuple | None = None
    loss_weight: int | None = None
    own_objective: bool = False

    def __post_init__(self):
        if (self.loss is None) == (self.step_loss is None):
            raise ValueError("a local pass has either a loss of the outputs or a step loss")
        if self.forward is not None and self.loss is None:
            raise ValueError("a forward goes with a loss of its outputs, not a step loss")

    def objective(self) -> LossFn:
        """The cohort trainer's loss of this pass (before the strategy's local objective)."""
        if self.step_loss is not None:
            return self.step_loss
        return on_outputs(self.loss, self.forward)

    def objective_under(self, strategy: Strategy, model: nn.Module) -> LossFn:
        """What this pass trains under ``strategy``: its loss in the strategy's local
        objective (unless ``own_objective``)."""
        loss = self.objective()
        return loss if self.own_objective else strategy.local_objective(loss, model)


@dataclass(frozen=True)
class Schedule:
    """Local phases chosen per round: ``options`` name lists of passes, ``pick(state)`` the
    list a round trains (CP-CFL: one pass while the strategy restricts training)."""

    options: dict[str, Sequence[Local]]
    pick: Callable[[FedState], str]


@dataclass(frozen=True)
class FinishedRun:
    """What a finished run hands its recipe's ``outputs``: the stage context (its output
    folder, results folder and run record), the model (holding the final model), the
    strategy, its final state and the clients' data."""

    ctx: StepContext
    model: nn.Module
    strategy: Strategy
    state: FedState
    data: LocalData


@dataclass(frozen=True)
class Recipe:
    """What a federated method trains: the engine's ``config``, its ``strategy`` (built from
    the config, the model and the clients' data), and its clients' training: one ``local``
    pass, or ``phases`` (built from the model and the strategy: passes in order, or a
    :class:`Schedule`), or a ``trainer`` of its own (from the model, the strategy, the
    clients' data and whether to vectorise the clients, as ``parallel`` says on their device:
    split learning's, whose clients and server step together every batch).
    ``choice``: the federation block whose ``strategy:`` choice (FedProx, SCAFFOLD, ...) the
    builder stacks over the method's strategy (None: the method's alone).
    ``setup_rounds``: rounds before the first training round in which the clients only
    exchange (Orchestra's clustering round 0), added to ``config.rounds``. ``parallel``: the
    params' ``parallel_clients`` setting.

    What the method's runtime does around the federation: ``model`` (image shape, device) ->
    the seeded initial model; ``monitor`` (stage context, model, the clients' device) -> what
    logs each round beside the strategy's metrics, or None (no slot: the library's k-NN
    monitor of the model's encoder, every ``monitor_every`` rounds); after the run, which left
    the strategy's final model in the model (:meth:`Strategy.load_final`): ``save`` (model,
    path, image shape; None: the model is not saved as one), ``describe`` (model) -> run-record
    facts, ``outputs`` (the :class:`FinishedRun`) -> facts, writing what else the run keeps
    (FeatARC's cluster models; split learning's two-part model and step logs)."""

    config: FederationConfig
    strategy: Callable[[FederationConfig, nn.Module, LocalData], Strategy]
    local: Local | None = None
    phases: Callable[[nn.Module, Strategy], Sequence[Local] | Schedule] | None = None
    trainer: Callable[[nn.Module, Strategy, LocalData, bool], RoundTrainer] | None = None
    choice: Any = None
    setup_rounds: int = 0
    parallel: str = "auto"
    model: Callable[[tuple[int, int, int], torch.device], nn.Module] | None = None
    monitor: MonitorOf | None = None
    save: Callable[[nn.Module, Path, tuple], None] | None = None
    describe: Callable[[nn.Module], dict] | None = None
    outputs: Callable[[FinishedRun], dict] | None = None

    def __post_init__(self):
        given = [x is not None for x in (self.local, self.phases, self.trainer)]
        if sum(given) != 1:
            raise ValueError("a recipe trains by one local pass, phases or a trainer")


def build_federation(
    recipe: Recipe, model: nn.Module, data: LocalData, ckpt: Path, fingerprint: str
) -> Federation:
    """The federation of ``recipe`` over ``data``, training ``model``, resumable from
    ``ckpt`` (a checkpoint of this ``fingerprint``)."""
    cfg = recipe.config
    if recipe.setup_rounds:
        cfg = replace(cfg, rounds=cfg.rounds + recipe.setup_rounds)
    strategy = recipe.strategy(cfg, model, data)
    if recipe.choice is not None:
        strategy = chosen_over(strategy, recipe.choice)
    return Federation(
        strategy, _trainer(recipe, model, strategy, data), data, cfg, ckpt, fingerprint
    )


def _trainer(recipe: Recipe, model: nn.Module, strategy: Strategy, data: LocalData) -> RoundTrainer:
    parallel = vectorise_clients(recipe.parallel, data.device)
    if recipe.trainer is not None:
        return recipe.trainer(model, strategy, data, parallel)
    size = data.images.shape[-1]

    def phase(local: Local) -> Phase:
        cohort = CohortTrainer(
            model,
            local.views(size),
            local.objective_under(strategy, model),
            local.optimizer,
            batch_size=local.batch_size,
            local_epochs=local.local_epochs,
            parallel=parallel,
            after_step=local.after_step(model) if local.after_step else None,
        )
        return Phase(cohort, local.trainable, local.seed_tag, local.loss_weight)

    if recipe.local is not None:
        only = phase(recipe.local)
        if not recipe.setup_rounds:
            return LocalTraining(only.cohort)
        return LocalTraining(phases=lambda s: [only] if s.round >= recipe.setup_rounds else [])
    phases = recipe.phases(model, strategy)
    if isinstance(phases, Schedule):
        options = {k: [phase(p) for p in v] for k, v in phases.options.items()}
        return LocalTraining(phases=lambda s: options[phases.pick(s)])
    return LocalTraining(phases=[phase(p) for p in phases])
