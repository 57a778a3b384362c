"""Eager against compiled local steps, per model family and precision: the table that the
``compile: auto`` setting reads (:mod:`fedssl.compiled`).

    python benchmarks/compiled_step.py [--turns 5] [--steps 3] [--only cnn ...] [--write]

The step is the cohort trainer's own step for a cohort of one, as the engine runs it (the
forward under the precision policy, the method's loss, backward, the stacked optimizer),
built once eagerly and once with ``compile: on``, from the same weights, on the same batch.
Each family runs in its own process (its own compile caches); in it, per precision, the two
steps take turns (eager first on even turns, compiled first on odd ones) and each turn's
``--steps`` steps are timed in CPU seconds of this process (the machine's other jobs do not
count), one thread. The first compiled step pays the compile: its CPU seconds (this process
and its children: the C++ compiler) and wall seconds are the one-time cost, cold (an empty
inductor cache; a machine's later runs find their kernels on disk and pay less). ``speedup``
is the median over turns of eager / compiled; a family and precision is ``on`` in the table
when it is at least :data:`THRESHOLD`. ``--write`` writes the table,
``results/bench/compiled_step/<cpu kind>.tsv`` (with ``--only``, its other rows kept).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
THRESHOLD = 1.10  # a compiled step must be this much faster to be chosen: above turn noise
COLUMNS = ("family", "scenario", "precision", "eager_ms", "compiled_ms", "speedup")
COLUMNS += ("compile_cpu_s", "compile_wall_s", "loss_rel_diff", "choice")


def resnet18_32():
    """FedSimCLR's CIFAR ResNet-18 (BN, width 64) at 32 x 32 x 3 on 2 x 32 views, NT-Xent."""
    from step_limits import batch_of, method_params

    from fedssl.methods.federated import trainer_loss
    from fedssl.models.encoders import seeded_contrastive_model

    p = method_params("cifar10_fedsimclr")
    shape = (3, 32, 32)
    build = lambda: seeded_contrastive_model(p.model, shape, p.seed, torch.device("cpu"))  # noqa: E731
    g = torch.Generator().manual_seed(0)
    return (
        build,
        trainer_loss(p),
        batch_of(tuple(torch.rand(32, *shape, generator=g) for _ in "ab")),
    )


def scenarios() -> dict:
    import step_limits as s

    return {
        "cnn": s.simclr_cnn,
        "resnet18": resnet18_32,
        "personal_cnn": s.personalised_cnn,
        "vit": s.moco_v3_vit,
    }


def cpu_seconds(children: bool = False) -> float:
    own = time.process_time()
    if not children:
        return own
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own + c.ru_utime + c.ru_stime


class Step:
    """One cohort trainer of one client, eager or compiled, with its own copy of the weights."""

    def __init__(self, build, loss_fn, batch, setting: str):
        from fedssl import compiled
        from fedssl.fl.cohort import Batch, CohortTrainer, OptimizerConfig, stack

        model = build()
        with compiled.policy(setting):
            self.trainer = CohortTrainer(model, None, loss_fn, OptimizerConfig(), 64, 1, False)
        state = stack([{k: v.detach() for k, v in model.state_dict(keep_vars=True).items()}])
        params = dict(model.named_parameters())  # frozen: an anchor, a momentum target
        self.trained = {k: v for k, v in state.items() if k in params and params[k].requires_grad}
        self.frozen = {k: v for k, v in state.items() if k in params and k not in self.trained}
        self.buffers = {k: v for k, v in state.items() if k not in params}
        self.opt = self.trainer.optimizer.init(self.trained)
        n = len(batch.views[0])
        labels = batch.labels if batch.labels is not None else torch.zeros(n, dtype=torch.long)
        self.batch = Batch(tuple(v[None] for v in batch.views), labels[None], batch.valid[None])

    def __call__(self) -> float:
        loss = self.trainer._step(
            self.trained, self.frozen, self.buffers, self.opt, [0], self.batch, 1e-3
        )
        return float(loss[0])


def measure(name: str, turns: int, steps: int) -> list[dict]:
    from fedssl import compiled, precision

    torch.set_num_threads(1)
    build, loss_fn, batch = scenarios()[name]()
    rows = []
    for setting in ("fp32", "fp32_channels_last", "bf16"):  # each a mode of its own
        with precision.policy(setting):
            eager, comp = (Step(build, loss_fn, batch, s) for s in ("off", "on"))
            first_eager = eager()
            cpu0, wall0 = cpu_seconds(children=True), time.perf_counter()
            first_comp = comp()  # the compile
            compile_cpu, compile_wall = cpu_seconds(True) - cpu0, time.perf_counter() - wall0
            times = {"eager": [], "compiled": []}
            for turn in range(turns):
                order = [("eager", eager), ("compiled", comp)][:: 1 if turn % 2 == 0 else -1]
                for kind, step in order:
                    start = cpu_seconds()
                    for _ in range(steps):
                        step()
                    times[kind].append((cpu_seconds() - start) / steps * 1e3)
        ratios = [e / c for e, c in zip(times["eager"], times["compiled"])]
        speedup = round(statistics.median(ratios), 2)  # the table's figure decides
        rows.append(
            {
                "family": compiled.family(eager.trainer.model),
                "scenario": name,
                "precision": setting,
                "eager_ms": round(statistics.median(times["eager"]), 1),
                "compiled_ms": round(statistics.median(times["compiled"]), 1),
                "speedup": speedup,
                "compile_cpu_s": round(compile_cpu, 1),
                "compile_wall_s": round(compile_wall, 1),
                "loss_rel_diff": f"{abs(first_comp - first_eager) / abs(first_eager):.1e}",
                "choice": "on" if speedup >= THRESHOLD else "off",
            }
        )
    return rows


def header(turns: int, steps: int) -> list[str]:
    from fedssl.stage.runtime import cpu_summary

    load = os.getloadavg()
    return [
        f"# {cpu_summary()}; torch {torch.__version__}; one thread",
        f"# load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
        f"({os.cpu_count()} cores); {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"# {turns} interleaved turns of {steps} steps, CPU ms a step (medians); "
        f"choice on where speedup (eager / compiled) >= {THRESHOLD}",
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None, choices=list(scenarios()))
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.turns, args.steps)))
        return
    rows = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    for name in args.only or scenarios():
        # a cold compile, as a machine's first run pays it (later runs reuse the disk cache)
        env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="compiled_step_")
        cmd = [sys.executable, __file__, "--child", name, "--turns", str(args.turns)]
        out = subprocess.run(
            cmd + ["--steps", str(args.steps)], env=env, check=True, capture_output=True, text=True
        ).stdout
        rows += json.loads(out.splitlines()[-1])
        for r in rows[-2:]:
            print("\t".join(str(r[c]) for c in COLUMNS), flush=True)
    lines = header(args.turns, args.steps)
    if args.write and kept_rows(rows):  # with the header of the run that measured them
        lines += [f"# rows kept from an earlier run: {ln[2:]}" for ln in old_header()]
        rows = kept_rows(rows) + rows
    lines += ["\t".join(COLUMNS)]
    lines += ["\t".join(str(r[c]) for c in COLUMNS) for r in rows]
    print("\n".join(lines))
    if args.write:
        table_path().parent.mkdir(parents=True, exist_ok=True)
        table_path().write_text("\n".join(lines) + "\n")


def table_path() -> Path:
    from fedssl.compiled import TABLE_DIR, cpu_kind

    return TABLE_DIR / f"{cpu_kind()}.tsv"


def old_header() -> list[str]:
    """The committed table's comment lines but those about rows it kept itself."""
    lines = table_path().read_text().splitlines()
    return [ln for ln in lines if ln[:1] == "#" and not ln.startswith("# rows kept")]


def kept_rows(measured: list[dict]) -> list[dict]:
    """The committed table's rows of the scenarios this run did not measure (``--only``)."""
    if not table_path().is_file():
        return []
    done = {r["scenario"] for r in measured}
    lines = [ln.split("\t") for ln in table_path().read_text().splitlines() if ln[:1] != "#"]
    rows = [dict(zip(lines[0], line)) for line in lines[1:]]
    return [r for r in rows if r["scenario"] not in done]


if __name__ == "__main__":
    main()
