"""Running a federation inside a stage: resume from its checkpoint, log every round (a progress
line and the per-round TSV that `dvc plots` reads), save the byte ledger, record the outcome."""
from __future__ import annotations

from torch import nn

from fedssl.data.store import to_device
from fedssl.fl.cohort import LocalData
from fedssl.fl.engine import Federation, FedState, client_data, write_round_log
from fedssl.runtime import write_json


def train_data(ctx) -> LocalData:
    """A stage's training split on its device, with the clients' index arrays."""
    images, labels = ctx.split("train")
    return client_data(to_device(images, ctx.device), labels, ctx.clients())


def run_federation(ctx, fed: Federation, model: nn.Module | None = None,
                   log_name: str = "rounds.tsv") -> FedState:
    """Run ``fed`` from its last checkpoint to the end. Writes ``communication.json`` into the
    stage's output and the round log into the experiment's results; loads the strategy's final
    model into ``model`` when given."""
    log_path = ctx.results_dir / log_name
    state = fed.start(model)
    ctx.run_info["resumed_from_round"] = state.round
    if state.round:
        print(f"resuming from round {state.round}", flush=True)

    def on_round(s: FedState):
        write_round_log(s.log, log_path)
        r = s.log[-1]
        print(f"round {r['round']}/{fed.cfg.rounds}: loss {r['loss']:.4f}, {r['clients']} "
              f"clients, {r['images_per_s']:.0f} img/s", flush=True)

    state = fed.run(state, on_round=on_round)
    write_round_log(state.log, log_path)
    ctx.run_info["rounds"] = [{k: r[k] for k in ("round", "seconds", "images_per_s")}
                              for r in state.log]
    write_json(ctx.out / "communication.json", state.ledger.summary())
    if model is not None:
        model.load_state_dict(fed.strategy.final_model(state))
    ctx.info.update(rounds=len(state.log),
                    final_loss=state.log[-1]["loss"] if state.log else None)
    return state
