"""Running a federation inside a stage: resume from its checkpoint, log every round (a progress
line and the per-round TSV that `dvc plots` reads), save the byte ledger, record the outcome.
:func:`run_rounds` is the round loop every federation runs through, with an ``on_round`` hook."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn

from fedssl.data import to_device
from fedssl.eval.monitor import knn_monitor
from fedssl.fl.cohort import LocalData, client_data
from fedssl.fl.state import LOG_FIELDS, TIMING_FIELDS, FedState, write_round_log
from fedssl.rounds.loop import Federation, MonitorOf
from fedssl.stage.progress import Progress, say
from fedssl.stage.runtime import write_json

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


def train_data(ctx: StepContext) -> LocalData:
    """A stage's training split on its device, with the clients' index arrays."""
    images, labels = ctx.split("train")
    return client_data(to_device(images, ctx.device), labels, ctx.clients())


def progress_line(row: dict, rounds: int, label: str = "") -> str:
    """One round's progress line: the loss, the clients, the throughput, then every metric a
    strategy added to the round log (accuracies, cluster use, ...)."""
    extra = "".join(
        f", {k} {v}" for k, v in row.items() if k not in LOG_FIELDS and k not in TIMING_FIELDS
    )
    return (
        f"{label}round {row['round']}/{rounds}: loss {row['loss']:.4f}, {row['clients']} "
        f"clients, {row['images_per_s']:.0f} img/s{extra}"
    )


def run_rounds(
    fed: Federation,
    state: FedState,
    log_path: Path | None = None,
    label: str = "",
    on_round: Callable[[FedState], None] | None = None,
) -> FedState:
    """Run ``fed`` from ``state`` to its last round. After every round (and its checkpoint):
    the round log to ``log_path``, a progress line, then ``on_round(state)``, which may end the
    run early by raising (CP-CFL's clustering failure)."""
    label = f"{label} " if label else ""
    if state.round:
        print(f"{label}resuming from round {state.round}", flush=True)
    rounds_left = fed.cfg.rounds - state.round
    done = 0  # images this run has trained on

    def after_round(s: FedState) -> None:
        nonlocal done
        if log_path is not None:
            write_round_log(s.log, log_path)
        row = s.log[-1]
        round_images = round(row["images_per_s"] * row["seconds"])
        done += round_images
        bar.retotal(done + (fed.cfg.rounds - s.round) * round_images, done)
        say(progress_line(row, fed.cfg.rounds, label))
        if on_round is not None:
            on_round(s)

    with Progress(f"{label}rounds", rounds_left * round_images_estimate(fed)) as bar:
        return fed.run(state, on_round=after_round)


def round_images_estimate(fed: Federation) -> int:
    """The images a round trains on: the sampled share of the clients' data, times the local
    epochs where the trainer says them (corrected after every round)."""
    epochs = getattr(fed.trainer, "local_epochs", 0) or 1
    return int(epochs * fed.cfg.client_fraction * sum(fed.data.sizes()))


def attach_monitor(
    ctx: StepContext, fed: Federation, model: nn.Module | None, state: FedState
) -> None:
    """The k-NN monitor on ``fed`` (:mod:`fedssl.eval.monitor`), with the untrained network's
    accuracy when the run starts at round 0."""
    if model is None:
        raise ValueError("monitor_every: this method's federation has no model to monitor")
    fed.monitor = knn_monitor(ctx, model, fed.cfg.monitor_every, fed.cfg.rounds, fed.cfg.seed)
    if state.round == 0:
        fed.monitor.start = fed.monitor.accuracy()


def run_federation(
    ctx: StepContext,
    fed: Federation,
    model: nn.Module | None = None,
    log_name: str = "rounds.tsv",
    monitor: MonitorOf | None = None,
) -> FedState:
    """Run ``fed`` from its last checkpoint to the end, logging each round what ``monitor``
    (stage context, model, the clients' device) builds, or else the library's k-NN monitor
    where ``monitor_every`` asks. Writes ``communication.json`` into the stage's output and the
    round log into the experiment's results; loads the strategy's final model into ``model``
    when given (:meth:`fedssl.strategies.base.Strategy.load_final`)."""
    log_path = ctx.results_dir / log_name
    # the clients train elsewhere: a trainer that carries the rounds to them (fedssl.flower)
    if getattr(ctx, "remote_rounds", None) is not None:
        fed.trainer = ctx.remote_rounds
    state = fed.start(model)
    ctx.run_info["resumed_from_round"] = state.round
    if state.round < fed.cfg.rounds:
        if monitor is not None:
            fed.monitor = monitor(ctx, model, fed.data.device)
        elif fed.cfg.monitor_every:
            attach_monitor(ctx, fed, model, state)
    state = run_rounds(fed, state, log_path)
    write_round_log(state.log, log_path)
    ctx.run_info["rounds"] = [
        {k: r[k] for k in ("round", "seconds", "images_per_s")} for r in state.log
    ]
    write_json(ctx.out / "communication.json", state.ledger.summary())
    if model is not None:
        fed.strategy.load_final(model, state)
    ctx.info.update(rounds=len(state.log), final_loss=state.log[-1]["loss"] if state.log else None)
    return state
