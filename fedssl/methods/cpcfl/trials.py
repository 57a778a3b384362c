"""IFCA's trials of CP-CFL's pool (spec §8.8): after T_c, every client on one model for
``patience`` rounds in a row (or in the last round) is a clustering failure; the step then
restarts from new random models, at most ``cfl.restarts`` times."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedssl.fl.state import FedState, write_round_log
from fedssl.methods.cpcfl.federation import initial_pool, make_federation
from fedssl.rounds import runner
from fedssl.rounds.loop import Federation

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


class ClusteringFailed(Exception):
    """IFCA's failure rule fired; ``state`` is the run at that round."""

    def __init__(self, state: FedState):
        super().__init__(f"every client on one model (round {state.memo.get('failed_at')})")
        self.state = state


def run_rounds(fed: Federation, log_path: Path | None, name: str) -> FedState:
    """Run ``fed`` from its checkpoint; raises ClusteringFailed when the failure rule fires."""
    state = fed.start(None)
    if state.round:
        print(f"{name}: resuming from round {state.round}", flush=True)
    if state.memo.get("failed_at") is not None:
        raise ClusteringFailed(state)

    def stop_on_failure(s: FedState):
        if s.memo.get("failed_at") is not None:
            raise ClusteringFailed(s)

    return runner.run_rounds(fed, state, log_path, name, stop_on_failure)


def run_trials(ctx: StepContext, data, image_shape, num_classes: int, encoder, tests, groups):
    """Attempt after attempt, each from its own seeded pool (``encoder``: the pool's shared
    encoder, or None), until one ends without the failure rule firing or no restart is left
    (the last attempt then stands, failure and all). Returns the final attempt's federation
    and state, and the failed attempts as (ledger prefix, clusters, state)."""
    p, c = ctx.exp.method, ctx.exp.method.federation
    failed: list[tuple[str, int, FedState]] = []
    for attempt in range(c.restarts + 1):
        pool = initial_pool(p, image_shape, num_classes, ctx.device, attempt, encoder)
        fed = make_federation(
            p,
            data,
            image_shape,
            num_classes,
            pool,
            ctx.resume_path.with_suffix(f".attempt{attempt}.pt"),
            f"{ctx.fingerprint}/attempt{attempt}",
            attempt,
            tests,
            groups,
        )
        name = f"attempt {attempt}" if c.restarts else "cfl"
        try:
            state = run_rounds(fed, ctx.results_dir / "rounds.tsv", name)
            break
        except ClusteringFailed as failure:
            state = failure.state
            if attempt == c.restarts:  # no restart left: this run stands, failure and all
                state = fed.run(state)
                break
            print(
                f"attempt {attempt}: every client on one model since round "
                f"{state.memo['failed_at'] - c.patience + 1}: restarting",
                flush=True,
            )
            write_round_log(state.log, ctx.out / f"failed{attempt}_rounds.tsv")
            failed.append((f"failed{attempt}/", c.clusters, state))
    return fed, state, failed
