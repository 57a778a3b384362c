"""Test data written in real on-disk formats, and a throw-away copy of the project."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import numpy as np

from tests.formats import write_fashion_mnist

REPO = Path(__file__).resolve().parents[1]


def toy_images(n: int, seed: int, num_classes: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Learnable 28x28 images: each class is a bright bar at its own position, plus noise."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % num_classes
    images = rng.integers(0, 60, size=(n, 28, 28)).astype(np.uint8)
    for c in range(num_classes):
        images[labels == c, 4 + 5 * c : 8 + 5 * c, 4:24] = 220
    return images, labels


TINY_EXPERIMENT = """\
title: {title}
partition: tiny_dir05_m3
method:
  name: {method}
  model: {{arch: {arch}, norm: gn, channels_per_group: 4, width: 4, proj_hidden: 16, proj_dim: 8}}
{training}  seed: 0
features: {{layer: backbone, train_size: null, batch_size: 256}}
linear_probe: {{epochs: 5, lr: 0.01, weight_decay: 0.0, batch_size: 64, standardize: true, seed: 0}}
knn: {{k: 5, temperature: 0.1}}
"""

TINY_SIMCLR_TRAINING = """\
  federation:
    rounds: {rounds}
    local_epochs: 1
    client_fraction: 1.0
    batch_size: 32
    optimizer: adam
    lr: 0.001
    lr_schedule: constant
    momentum: 0.9
    weight_decay: 0.0
    parallel_clients: auto
  temperature: 0.5
  augment: {{crop_scale: [0.5, 1.0], crop_ratio: [0.75, 1.3333], flip_p: 0.5, jitter_p: 0.8,
            brightness: 0.4, contrast: 0.4, saturation: 0.0, hue: 0.0, grayscale_p: 0.0,
            blur_p: 0.0, blur_sigma: [0.1, 2.0], solarize_p: 0.0}}
"""


# The probes' sections of a tiny experiment (in a ``str.format`` template: braces doubled).
TINY_PROBES = """\
features: {{layer: backbone, train_size: null, batch_size: 256}}
linear_probe: {{epochs: 5, lr: 0.01, weight_decay: 0.0, batch_size: 64, standardize: true, seed: 0}}
knn: {{k: 5, temperature: 0.1}}
"""


def tiny_experiment(title: str, arch: str, method: str, rounds: int = 0) -> str:
    training = TINY_SIMCLR_TRAINING.format(rounds=rounds) if method == "fedsimclr" else ""
    return TINY_EXPERIMENT.format(title=title, arch=arch, method=method, training=training)


TINY_MFCL_EXPERIMENT = """\
title: MFCL({norm})
partition: tiny_dir05_m3
method:
  name: mfcl
  augment: {{crop_scale: [0.5, 1.0], crop_ratio: [0.75, 1.3333], flip_p: 0.5, jitter_p: 0.8,
            brightness: 0.4, contrast: 0.4, saturation: 0.0, hue: 0.0, grayscale_p: 0.0,
            blur_p: 0.0, blur_sigma: [0.1, 2.0], solarize_p: 0.0}}
  seed: 0
  client_module: {{arch: resnet18, width: 4, norm: {norm}, channels_per_group: 2}}
  phases:
    phase1:
      federation: {{rounds: 2, local_epochs: 1, batch_pairs: 16, lr: 0.01, loss: bce,
                   client_fraction: 1.0, secure_aggregation: {secure}}}
  export: {{pairs: 2, client_dropout: 0.34, bn_export_mode: eval, batch_pairs: 64}}
  rserver: {{width: 4, proj_hidden: 16, proj_dim: 8, epochs: 2, batch_pairs: 32, lr: 1.0,
            lr_scaling: none, weight_decay: 0.0001, warmup_epochs: 1, temperature: 0.5}}
features: {{layer: backbone, train_size: null, batch_size: 256}}
linear_probe: {{epochs: 5, lr: 0.01, weight_decay: 0.0, batch_size: 64, standardize: true, seed: 0}}
knn: {{k: 5, temperature: 0.1}}
"""


def add_tiny_mfcl(root: Path) -> list[str]:
    """Add MFCL experiments (TN with secure aggregation, BN) to a tiny project, in a pipeline
    `mfcl` beside `default` (which is left as it is); returns their names."""
    params = root / "params"
    names = {"tiny_mfcl_tn": ("tn", "true"), "tiny_mfcl_bn": ("bn", "false")}
    for name, (norm, secure) in names.items():
        (params / "experiments" / f"{name}.yaml").write_text(
            TINY_MFCL_EXPERIMENT.format(norm=norm, secure=secure)
        )
    with open(params / "pipelines.yaml", "a") as f:
        f.write(f"  mfcl: [{', '.join(names)}, tiny_simclr]\n")
    return list(names)


_TEMPLATES: dict[bool, Path] = {}  # git or not -> a tiny project built in this test process


def make_tiny_project(root: Path, git: bool = True) -> Path:
    """A copy of the project's code with its own params: a 240-image Fashion-MNIST-format data
    set, 3 clients, and three experiments (FedSimCLR, random init, raw pixels). Built once per
    test process (planning, git and DVC set-up cost seconds) and copied to ``root``."""
    if git not in _TEMPLATES:
        template = Path(tempfile.mkdtemp(prefix="tiny_project_"))
        atexit.register(shutil.rmtree, template, True)
        _TEMPLATES[git] = build_tiny_project(template, git)
    shutil.copytree(_TEMPLATES[git], root, symlinks=True, dirs_exist_ok=True)
    return root


def made_tiny_project(root: Path) -> Path:
    """:func:`make_tiny_project` with its default pipeline made by Snakemake (whose run ends by
    ``dvc commit``-ing what it made), as several modules' tests start from. Made once per test
    process and copied to ``root``: a module pays for the copy, not for a dozen stage
    processes. The copy keeps the files' times, so Snakemake and DVC see it as made."""
    shutil.copytree(_made_template(), root, symlinks=True, dirs_exist_ok=True)
    return root


@functools.cache
def _made_template() -> Path:
    template = Path(tempfile.mkdtemp(prefix="made_project_"))
    atexit.register(shutil.rmtree, template, True)
    make_tiny_project(template)
    run(["snakemake", "--cores", "2", "--resources", "gpu=1"], template)
    return template


def copy_code(root: Path) -> None:
    """The project's code (library, stage scripts, workflow) into ``root``."""
    for item in ("fedssl", "stages", "Snakefile", "profiles"):
        src = REPO / item
        (
            shutil.copytree(src, root / item, ignore=shutil.ignore_patterns("__pycache__"))
            if src.is_dir()
            else shutil.copy(src, root / item)
        )


def build_tiny_project(root: Path, git: bool) -> Path:
    copy_code(root)
    write_fashion_mnist(root / "raw", {"train": toy_images(240, 0), "t10k": toy_images(80, 1)})
    params = root / "params"
    for sub in ("datasets", "partitions", "experiments"):
        (params / sub).mkdir(parents=True)
    (params / "datasets" / "tiny.yaml").write_text(
        "name: fashion_mnist\ndata_root: raw\ndownload: false\n"
    )
    (params / "partitions" / "tiny_dir05_m3.yaml").write_text(
        "dataset: tiny\nnum_clients: 3\nscheme: {kind: dirichlet, alpha: 0.5, "
        "min_per_client: 20}\nsubset: null\nseed: 0\n"
    )
    rows = {
        "tiny_simclr": ("FedSimCLR", "small_cnn", "fedsimclr", 2),
        "tiny_random": ("Random init", "small_cnn", "none", 0),
        "tiny_pixels": ("Raw pixels", "pixels", "none", 0),
    }
    for name, (title, arch, method, rounds) in rows.items():
        (params / "experiments" / f"{name}.yaml").write_text(
            tiny_experiment(title, arch, method, rounds)
        )
    (params / "pipelines.yaml").write_text(
        "pipelines:\n  default: [tiny_simclr, tiny_random, tiny_pixels]\n"
    )
    # the project's own ignore rules: DVC refuses a pipeline file that git ignores
    shutil.copy(REPO / ".gitignore", root / ".gitignore")
    run(["python", "-m", "fedssl.pipeline", "write"], root)
    if git:
        run(["git", "init", "-q"], root)
        run(["dvc", "init", "-q"], root)
        run(["dvc", "config", "core.analytics", "false"], root)
    return root


def run(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


# ------------------------------------------------------------------ running stages of a project
@contextmanager
def in_project(root: Path):
    """Work inside a tiny project (its params, its artifacts): yields ``planned(kind,
    experiment)``, which finds that stage in the project's DAG."""
    from fedssl.plan.dag import Dag

    cwd = os.getcwd()
    os.chdir(root)
    try:
        yield lambda kind, experiment: PlannedStage(*Dag.for_stage(kind, experiment))
    finally:
        os.chdir(cwd)


class PlannedStage(NamedTuple):
    dag: object
    name: str

    @property
    def spec(self):
        return self.dag.stages[self.name]

    @property
    def argv(self) -> list[str]:
        """``python -m MODULE ARGS...`` as [MODULE, *ARGS]."""
        return self.spec.cmd.split()[2:]


def run_stage(planned: PlannedStage, upstream: bool = False) -> None:
    """Run a stage in this process (inside :func:`in_project`); with ``upstream``, first every
    stage it reads whose output is missing."""
    import importlib

    if upstream:
        for name in planned.spec.upstream:
            if not (Path(planned.dag.stages[name].out) / "meta.json").exists():
                run_stage(PlannedStage(planned.dag, name), upstream=True)
    module, *args = planned.argv
    importlib.import_module(module).run(args)


def output_files(planned: PlannedStage) -> dict[str, bytes]:
    """Every file the stage wrote: its artifact folder and its experiment's results, by path."""
    from fedssl.plan.layout import results_dir

    experiment = planned.name.split("__", 1)[1]
    folders = [Path(planned.spec.out), Path(results_dir(experiment))]
    return {
        str(p): p.read_bytes()
        for d in folders
        if d.exists()
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


def kill_after_checkpoint(root: Path, planned: PlannedStage, timeout: float = 300):
    """Run the stage in a child process (one thread, CPU) and SIGKILL it the moment its first
    resume checkpoint is on disk: (its exit code, that checkpoint's path)."""
    import signal
    import sys
    import time

    from fedssl.stage.context import RESUME_DIR

    folder = root / RESUME_DIR
    proc = subprocess.Popen(
        [sys.executable, "-m", *planned.argv],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "FEDSSL_THREADS": "1", "FEDSSL_DEVICE": "cpu"},
    )
    deadline = time.time() + timeout
    found: list[Path] = []
    while not found and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
        # `<stage>.pt`, or a method's own `<stage>.<part>.pt`; never the `.tmp` being written
        found = sorted(folder.glob(f"{planned.name}.*pt")) if folder.exists() else []
    if proc.poll() is not None:
        raise AssertionError(
            f"{planned.name} ended ({proc.returncode}) before it could be "
            f"killed:\n{proc.stderr.read()[-3000:]}"
        )
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert found, f"{planned.name} wrote no checkpoint in {timeout} s"
    return proc.returncode, found[0]


def run_stages_in_process(root: Path, pipelines) -> None:
    """Run every stale stage of ``pipelines`` of the project at ``root`` in this process (one
    torch import instead of one per stage), upstream first, as the front ends would."""
    import importlib
    import os
    import sys

    cwd, path = os.getcwd(), list(sys.path)
    os.chdir(root)
    sys.path.insert(0, str(root))
    try:
        from fedssl.plan.dag import Dag
        from fedssl.plan.freshness import why_stale

        for pipeline in pipelines:
            dag = Dag(pipeline)
            for name, stage in dag.stages.items():
                if why_stale(dag, name):
                    _, _, module, *args = stage.cmd.split()
                    importlib.import_module(module).run(args)
    finally:
        os.chdir(cwd)
        sys.path[:] = path


def tiny_chain_project(
    root: Path, experiments: dict[str, str], pipeline: str, runs: list[str]
) -> Path:
    """A tiny project (no git) with ``experiments`` (name -> YAML) added, and a pipeline
    ``pipeline`` running ``runs`` (some of them, or the project's own such as tiny_simclr)."""
    make_tiny_project(root, git=False)
    for name, text in experiments.items():
        (root / "params" / "experiments" / f"{name}.yaml").write_text(text)
    with open(root / "params" / "pipelines.yaml", "a") as f:
        f.write(f"  {pipeline}: [{', '.join(runs)}]\n")
    return root


def assert_same_files(resumed: dict[str, bytes], uninterrupted: dict[str, bytes]) -> None:
    """Two runs' :func:`output_files` are byte-identical (else: where the first file differs)."""
    assert resumed.keys() == uninterrupted.keys()
    differ = [p for p, content in uninterrupted.items() if resumed[p] != content]
    for path in differ:
        want = uninterrupted[path]
        got = resumed[path]
        at = next(
            (i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want))
        )
        raise AssertionError(
            f"{', '.join(differ)} differ; {path} from byte {at}: resumed "
            f"{got[at - 200 : at + 100]!r}, uninterrupted "
            f"{want[at - 200 : at + 100]!r}"
        )


def assert_a_killed_stage_resumes(
    root: Path, kind: str, experiment: str, first_work: str, capsys, monkeypatch
) -> None:
    """Run the stage uninterrupted (upstream first), then in a child SIGKILLed at its first
    checkpoint, then once more, all on one CPU thread: the last run must not redo
    ``first_work`` (what the uninterrupted run printed first), must leave every output
    byte-identical and remove its checkpoint."""
    import signal

    monkeypatch.setenv("FEDSSL_THREADS", "1")
    monkeypatch.setenv("FEDSSL_DEVICE", "cpu")
    with in_project(root) as dag_for:
        stage = dag_for(kind, experiment)
        run_stage(stage, upstream=True)
        assert first_work in capsys.readouterr().out
        uninterrupted = output_files(stage)
        code, checkpoint = kill_after_checkpoint(root, stage)
        assert code == -signal.SIGKILL
        assert checkpoint.exists()
        run_stage(stage)
        assert first_work not in capsys.readouterr().out  # it went on from the checkpoint
        assert_same_files(output_files(stage), uninterrupted)
        assert not checkpoint.exists()


def run_pretrain_step_chain(
    root: Path, monkeypatch, pipeline: str, experiment: str, package: str
) -> dict[str, dict]:
    """The chain of a one-pretrain-step method (:class:`fedssl.methods.base.PretrainStepMethod`)
    in a tiny project, in process on the CPU: its stages are pretrain, features, evaluate and
    costs, its cost code (``fedssl/methods/<package>/costs.py``) is none of pretrain's, and once
    the report and all it reads have run, the experiment has its probes' metrics. Returns the
    report's rows by experiment."""
    import json

    from fedssl.plan.dag import Dag

    monkeypatch.chdir(root)
    monkeypatch.setenv("FEDSSL_DEVICE", "cpu")
    dag = Dag(pipeline)
    kinds = [s.kind for s in dag.stages.values() if s.name.endswith(f"__{experiment}")]
    assert kinds == ["pretrain", "features", "evaluate", "costs"]
    cost_code = f"fedssl/methods/{package}/costs.py"
    assert cost_code in dag.stages[f"costs__{experiment}"].code
    assert cost_code not in dag.stages[f"pretrain__{experiment}"].code
    with in_project(root) as planned:
        run_stage(planned("report", pipeline), upstream=True)
    metrics = json.loads((root / f"results/experiments/{experiment}/metrics.json").read_text())
    assert any("linear" in k for k in metrics) and any("knn" in k for k in metrics)
    report = json.loads((root / f"results/reports/{pipeline}/report.json").read_text())
    return {r["experiment"]: r for r in report["rows"]}


def run_and_record(root: Path, pipelines) -> None:
    """:func:`run_stages_in_process`, then record the results as the front ends leave them:
    the dvc.yaml files regenerated (the new results' metrics join), the DAG check every stage
    reads, and every stage committed to DVC."""
    run_stages_in_process(root, pipelines)
    run(["python", "-m", "fedssl.pipeline", "write"], root)
    run(["python", "-m", "fedssl.pipeline", "check"], root)
    run(["dvc", "commit", "--force", "--quiet"], root)


def spy_local_rounds(fed):
    """Record every client's local start and what it trained (before the upload's selection)."""
    s, seen = fed.strategy, {}
    local_start, upload = s.local_start, s.upload

    def spy_start(state, c, received):
        seen["start", c] = local_start(state, c, received)
        return seen["start", c]

    def spy_upload(state, c, trained):
        seen["trained", c] = cloned(trained)  # the row is refilled by the next client
        return upload(state, c, trained)

    s.local_start, s.upload = spy_start, spy_upload
    return seen


def cloned(tensors: dict) -> dict:
    """A copy of what a spy keeps past the call: a client's trained row is refilled by the
    next client trained one at a time."""
    return {k: v.clone() for k, v in tensors.items()}


def method_params(model, settings: dict):
    """A federated method's params validated from flat ``settings``: those its federation
    block holds go into ``method.federation``, so a test names each setting once."""
    block = model.model_fields["federation"].annotation.model_fields
    federation = {k: v for k, v in settings.items() if k in block and k not in model.model_fields}
    rest = {k: v for k, v in settings.items() if k not in federation}
    return model.model_validate(
        {**rest, "federation": {**rest.get("federation", {}), **federation}}
    )


def federation_changed(p, **changes):
    """``p`` with ``changes`` to its federation block."""
    return p.model_copy(update={"federation": p.federation.model_copy(update=changes)})


def opt_in(marker: str, variable: str, how: str, timeout: int) -> list:
    """The marks of a test module that runs only where ``variable`` is 1 (a real cluster, a
    real deployment): its marker, a generous timeout, and the skip that says ``how``."""
    import pytest

    return [
        getattr(pytest.mark, marker),
        pytest.mark.timeout(timeout),
        pytest.mark.skipif(os.environ.get(variable) != "1", reason=f"opt-in: {how}"),
    ]
