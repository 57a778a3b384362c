"""Compiled local steps (``compile``): what each setting chooses, from the committed table and
not from a timing; that a compiled step agrees with the eager one and compiles once; that every
committed result stays eager; that a stage records its choice and fingerprints it; that a
process with ATen's kernels capped compiles into a cache of its own."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fedssl import compiled, precision
from fedssl.fl.cohort import Batch, CohortTrainer, OptimizerConfig, stack
from fedssl.models.encoders import seeded_contrastive_model
from fedssl.params import ModelParams
from fedssl.presets import Presets
from tests.fl.test_engine import simclr_loss

SHAPE = (1, 16, 16)
MODEL = ModelParams(arch="small_cnn", norm="bn", width=8, proj_hidden=32, proj_dim=16)
BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def table(monkeypatch, tmp_path):
    """A committed table of this CPU kind, written by the test: (family, precision, choice)."""

    def write(*rows):
        monkeypatch.setattr(compiled, "TABLE_DIR", tmp_path)
        compiled.table.cache_clear()
        lines = ["# a comment line", "family\tprecision\tspeedup\tchoice"]
        lines += [f"{f}\t{p}\t1.5\t{c}" for f, p, c in rows]
        (tmp_path / f"{compiled.cpu_kind()}.tsv").write_text("\n".join(lines) + "\n")

    yield write
    compiled.table.cache_clear()


def small_cnn():
    return seeded_contrastive_model(MODEL, SHAPE, 0, torch.device("cpu"))


def test_each_setting_chooses_as_documented(table, monkeypatch):
    model = small_cnn()
    name = compiled.family(model)
    assert name == "ContrastiveModel/cnn"
    monkeypatch.setattr(compiled, "TABLE_DIR", Path("/nonexistent"))
    compiled.table.cache_clear()
    assert not compiled.chosen(model, "fp32", "auto")  # no table for this CPU: eager
    assert compiled.chosen(model, "fp32", "on") and not compiled.chosen(model, "fp32", "off")
    table((name, "fp32", "on"), (name, "bf16", "off"), ("Anchored/cnn", "bf16", "on"))
    assert compiled.chosen(model, "fp32", "auto")
    assert not compiled.chosen(model, "bf16", "auto")  # the row of the resolved precision
    other = seeded_contrastive_model(MODEL.model_copy(update={"arch": "resnet18"}), SHAPE, 0, "cpu")
    assert compiled.family(other) == "ContrastiveModel/resnet18"
    assert not compiled.chosen(other, "fp32", "auto")  # no row for its family: eager
    # fp32 channels-last is a mode of its own: the contiguous fp32 row does not speak for it
    assert not compiled.chosen(model, "fp32_channels_last", "auto")
    table((name, "fp32_channels_last", "on"))
    assert compiled.chosen(model, "fp32_channels_last", "auto")
    with pytest.raises(ValueError, match="compile 'fast'"):
        with compiled.policy("fast"):
            pass


def trainer_steps(setting: str, steps: int = 3):
    """A cohort of one, eager (``off``) or compiled (``on``), ``steps`` steps on fixed views."""
    torch.manual_seed(1)
    views = tuple(torch.rand(1, 16, *SHAPE) for _ in range(2))
    batch = Batch(views, torch.zeros(1, 16, dtype=torch.long), torch.ones(1, 16, dtype=bool))
    model = small_cnn()
    with compiled.policy(setting):
        trainer = CohortTrainer(model, None, simclr_loss(0.5), OptimizerConfig(), 16, 1, False)
    state = stack([{k: v.detach() for k, v in model.state_dict(keep_vars=True).items()}])
    trained = {k: v for k, v in state.items() if k in trainer.param_names}
    buffers = {k: v for k, v in state.items() if k not in trained}
    opt = trainer.optimizer.init(trained)
    losses = []
    for step in range(steps):
        # after its first step a compiled trainer runs what it compiled: never again a compile
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            losses.append(float(trainer._step(trained, {}, buffers, opt, [0], batch, 1e-2)[0]))
    return losses, trained


def test_a_compiled_step_agrees_with_the_eager_one_and_compiles_once():
    """Three Adam steps of a small BN CNN, compiled against eager, fp32: inductor reorders the
    arithmetic, so not bit for bit, but the losses agree to 1e-5 and the weights to 1e-4 of
    their update (measured: a few 1e-7 and 1e-6)."""
    torch._dynamo.reset()
    eager_losses, eager = trainer_steps("off")
    _, start = trainer_steps("off", steps=0)
    with precision.policy("fp32"):
        losses, weights = trainer_steps("on")
    assert losses == pytest.approx(eager_losses, rel=1e-5)
    update = torch.cat([(eager[k] - start[k]).flatten() for k in start])
    gap = torch.cat([(weights[k] - eager[k]).flatten() for k in start])
    assert gap.norm() < 1e-4 * update.norm()


def test_a_process_that_compiles_nothing_never_imports_the_compiler():
    """The trainer's modules leave torch._dynamo unimported (about 1.3 s of every stage
    process's start) until a step compiles, which marks the trainer's trace-time constant
    then: the test above fails with a recompile error when that mark is missing."""
    code = "import sys, fedssl.fl.cohort; print('torch._dynamo' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# a vectorised reduction: inductor's AVX-512 and AVX2 kernels of it differ
CAPPED_STEP = """
import torch
from torch._inductor.runtime.cache_dir_utils import cache_dir
from fedssl import compiled
cache_dir()  # torch has looked (and set the variable), as a stage's imports make it
compiled.separate_capped_cache()
f = torch.compile(lambda x: (x.sin() * x.cos()).sum(1).log_softmax(0))
print(f(torch.linspace(-3, 3, 64 * 33).reshape(64, 33)).tolist())
"""


def test_a_capped_process_never_runs_kernels_compiled_uncapped(tmp_path):
    """Inductor picks its vector instructions by ATEN_CPU_CAPABILITY without keying its cache on
    them: a process capped at AVX2 that shares the cache of an uncapped one computes garbage
    (measured with torch 2.14: this log-softmax off by up to 5 nats, a CNN's loss 5e28 for 2.48).
    With :func:`compiled.separate_capped_cache` it compiles its own kernels and agrees with the
    uncapped process to float rounding. Each process is fresh, its temp folder (where torch's
    default cache lies) an empty one of the test's."""

    def run(**caps):
        env = {**os.environ, "TMPDIR": str(tmp_path)}
        for var in ("TORCHINDUCTOR_CACHE_DIR", "ATEN_CPU_CAPABILITY"):
            env.pop(var, None)
        env.update(caps)
        proc = subprocess.run(
            [sys.executable, "-c", CAPPED_STEP], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return torch.tensor(json.loads(proc.stdout.splitlines()[-1]))

    uncapped, capped = run(), run(ATEN_CPU_CAPABILITY="avx2")
    assert torch.allclose(capped, uncapped, rtol=1e-5, atol=1e-5)
    assert (tmp_path / f"torchinductor_{os.getuid()}_avx2").is_dir()


def test_committed_results_stay_eager():
    """No committed experiment sets ``compile``: every one trains eagerly, as its results were
    made (``auto`` would read the table; ``off`` is the default)."""
    presets = Presets()
    assert all(presets.load("experiment", n).compile == "off" for n in presets.names("experiment"))


def test_a_stage_records_its_compile_choice_and_fingerprints_it(tmp_path, monkeypatch):
    """A tiny FedSimCLR pretraining set to ``compile: on`` compiles its trainer's step once
    (torch.compile spied on), says so in meta.json and its run record, reads ``compile`` among
    its params and resumes only under the same setting."""
    from fedssl.stage import context as stage
    from tests.fixtures import in_project, make_tiny_project, run_stage

    root = make_tiny_project(tmp_path, git=False)
    exp = root / "params/experiments/tiny_simclr.yaml"
    exp.write_text(exp.read_text() + "compile: 'on'\n")
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn: seen.append(fn) or fn)
    with in_project(root) as planned:
        pretrain = planned("pretrain", "tiny_simclr")
        run_stage(pretrain, upstream=True)
        meta = json.loads((Path(pretrain.spec.out) / "meta.json").read_text())
        record = json.loads((stage.RUNS_DIR / f"{pretrain.name}.json").read_text())
    assert len(seen) == 1
    assert meta["compile"] == "on" and meta["compiled_steps"] == {"ContrastiveModel/cnn": "on"}
    assert record["compiled_steps"] == meta["compiled_steps"]
    assert "compile" in pretrain.spec.params[str(Path("params/experiments/tiny_simclr.yaml"))]
    assert compiled._active == "off"
    from fedssl.stage.base import Stage

    ran = SimpleNamespace(device=None, info={"precision": "fp32", "compile": "on"})
    assert Stage.settings.fget(ran)["compile"] == "on"  # a checkpoint of another setting
    eager = SimpleNamespace(device=None, info={"precision": "fp32"})  # is not resumed; an
    assert "compile" not in Stage.settings.fget(eager)  # eager run's, as before the setting


def test_the_committed_tables_choose_by_their_own_speedups():
    """Every committed table's choice is the benchmark's rule applied to its measured speedup,
    so a table cannot say ``on`` where the step measured slower."""
    import sys

    sys.path.insert(0, str(BENCH))
    from compiled_step import THRESHOLD

    paths = sorted(compiled.TABLE_DIR.glob("*.tsv"))
    assert paths, "no committed table"
    for path in paths:
        rows = compiled.table.__wrapped__(path.stem)
        assert rows, path
        lines = [ln.split("\t") for ln in path.read_text().splitlines() if ln[:1] != "#"]
        head = lines[0]
        for line in lines[1:]:
            r = dict(zip(head, line))
            assert r["choice"] == ("on" if float(r["speedup"]) >= THRESHOLD else "off"), r


def test_the_speed_page_shows_the_committed_table():
    """The speed page's table of compiled steps is the committed table's rows, to the digit."""
    page = (BENCH.parent / "docs/explanation/speed.md").read_text()
    for path in sorted(compiled.TABLE_DIR.glob("*.tsv")):
        lines = [ln.split("\t") for ln in path.read_text().splitlines() if ln[:1] != "#"]
        for line in lines[1:]:
            r = dict(zip(lines[0], line))
            cells = ("family", "precision", "eager_ms", "compiled_ms", "speedup", "compile_cpu_s")
            row = "| " + " | ".join(r[c] for c in cells) + f" | {r['choice']} |"
            assert row in page, row
