"""Encoders to take away: each method family's trained encoder on a tiny project goes out as
safetensors + a JSON card and as a `torch.export` program, and comes back, through
`load_encoder` or through `torch.export.load` alone, as a module giving the very features the
probes read; the Markdown model card states what the JSON card holds."""

from __future__ import annotations

import importlib
import json
import os
import shutil

import numpy as np
import pytest
import torch

from fedssl.methods.hooks import resolve_hook
from tests.fixtures import add_tiny_mfcl, make_tiny_project
from tests.lwfedssl_fixtures import TINY_PARTITION, TINY_SCRATCH, tiny_text
from tests.methods.mocosfl.test_mocosfl import TINY as TINY_SFL

pytestmark = pytest.mark.timeout(900)

# one experiment per family of encoders (CNN backbone and its projection head, MFCL client
# module + rServer, ViT, split net); all but the last two run their whole chain
EXPERIMENTS = [
    "tiny_simclr",
    "tiny_random_proj",
    "tiny_mfcl_tn",
    "tiny_lw_fedssl",
    "tiny_vit_scratch",
    "tiny_mocosfl_c2",
]


def run_stages(dag, names) -> None:
    """Run these stages of the DAG in this process, upstream first."""
    for stage in dag.stages.values():
        if stage.name in names:
            _, _, module, *args = stage.cmd.split()
            importlib.import_module(module).run(args)


def upstream_of(dag, name: str) -> set[str]:
    todo, seen = [name], set()
    while todo:
        for up in dag.stages[todo.pop()].upstream:
            if up not in seen:
                seen.add(up)
                todo.append(up)
    return seen


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    from fedssl.plan.dag import Dag

    root = make_tiny_project(tmp_path_factory.mktemp("export"), git=False)
    add_tiny_mfcl(root)
    params = root / "params"
    (params / "experiments" / "tiny_random_proj.yaml").write_text(
        "extends: tiny_random\nfeatures: {layer: projection, train_size: null, batch_size: 256}\n"
    )
    (params / "partitions" / "tiny_iid_m3_srv.yaml").write_text(TINY_PARTITION)
    (params / "experiments" / "tiny_lw_fedssl.yaml").write_text(tiny_text("lw_fedssl"))
    (params / "experiments" / "tiny_vit_scratch.yaml").write_text(TINY_SCRATCH)
    (params / "partitions" / "tiny_shards_m3.yaml").write_text(
        "dataset: tiny\nnum_clients: 3\nscheme: {kind: shards, classes_per_client: 2}\n"
        "server_holdout: 40\nseed: 0\n"
    )
    (params / "experiments" / "tiny_mocosfl_c2.yaml").write_text(
        TINY_SFL.format(title="MocoSFL", variant="mocosfl", cut=2)
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("FEDSSL_DEVICE", "cpu")
        dag = Dag(None, experiments=EXPERIMENTS)
        wanted = set()
        for exp in EXPERIMENTS:
            stages = dag.of_experiment[exp]
            if exp in ("tiny_simclr", "tiny_random_proj", "tiny_vit_scratch"):
                wanted |= {s for s in stages if dag.stages[s].kind in ("features", "evaluate")}
            feats = next(s for s in stages if dag.stages[s].kind == "features")
            wanted |= upstream_of(dag, feats)
        run_stages(dag, wanted)
        yield root


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_an_exported_encoder_gives_the_probes_features(project, monkeypatch, experiment):
    from fedssl.eval.probes import extract_features
    from fedssl.export import export, load_encoder
    from fedssl.stage.context import StageContext

    monkeypatch.chdir(project)
    out = export(experiment, project / "exported" / experiment)
    ctx = StageContext("features", experiment)
    ctx.device = torch.device("cpu")
    images, _ = ctx.split("test")
    expected = extract_features(ctx.method.encoder(ctx), images, 64, ctx.device)
    state = torch.get_rng_state()
    moved = project / "elsewhere" / experiment  # only the two files travel
    moved.mkdir(parents=True)
    for f in ("encoder.json", "encoder.safetensors", "encoder.pt2"):
        shutil.copy(out / f, moved / f)
    loaded = load_encoder(moved)
    assert torch.equal(torch.get_rng_state(), state)  # the builder's seeding stays inside
    assert type(loaded).__module__.startswith("fedssl.") and not loaded.training
    got = extract_features(loaded, images, 64, torch.device("cpu"))
    assert got.shape == expected.shape and np.array_equal(got, expected)
    program = torch.export.load(moved / "encoder.pt2").module()  # torch alone
    assert type(program).__module__.startswith("torch.")
    x = torch.from_numpy(np.array(images[:64])).float() / 255  # what the probes feed it
    with torch.no_grad():
        assert np.array_equal(program(x).numpy(), expected[:64])  # the probes' batch
        one = program(x[:1])  # any batch size (kernels differ by batch: the eager one's)
        assert torch.equal(one, loaded(x[:1])) and one.shape == (1, expected.shape[1])
    card = json.loads((out / "encoder.json").read_text())
    assert card["architecture"]["feature_dim"] == expected.shape[1]
    assert card["params"]["method"] == card["builder"]["params"]
    assert card["data"]["partition"] == ctx.exp.partition
    assert card["data"]["dataset"] == "tiny"
    assert all(v["fingerprint"] for v in card["trained_by"].values())


def test_every_method_evaluated_by_the_probes_can_export_its_encoder():
    from fedssl.methods import registry

    probed = [m for m in registry.all() if "features" in m.evaluation_sections]
    assert {m.name for m in probed} >= {
        "none",
        "fedsimclr",
        "mfcl",
        "mocosfl",
        "lw_fedssl",
        "vit_scratch",
    }
    for m in probed:
        assert callable(resolve_hook(m.encoder_builder)), m.name


def test_a_method_without_a_frozen_encoder_says_so(project, monkeypatch):
    from fedssl.export import export
    from fedssl.stage.runtime import StageFailed

    monkeypatch.chdir(project)
    (project / "params" / "experiments" / "tiny_leak.yaml").write_text(
        "title: leak\npartition: tiny_dir05_m3\n"
        "method: {name: gradient_leakage, settings: [{label: full, hidden_fc: 0}]}\n"
    )
    with pytest.raises(
        StageFailed,
        match="method 'gradient_leakage' has no frozen encoder to "
        "export .it is evaluated by its own steps",
    ):
        export("tiny_leak")


def test_the_card_records_metrics_and_versions(project, monkeypatch):
    from fedssl.export import export

    monkeypatch.chdir(project)
    card = json.loads((export("tiny_simclr") / "encoder.json").read_text())
    assert (project / "artifacts" / "exports" / "tiny_simclr" / "encoder.safetensors").is_file()
    metrics = json.loads((project / "results/experiments/tiny_simclr/metrics.json").read_text())
    assert card["metrics"] == metrics and card["metrics"]["linear_top1"] > 0
    assert card["method"] == "fedsimclr" and card["label"] == "FedSimCLR"
    assert card["builder"]["function"] == "fedssl.models.encoders:contrastive_encoder"
    assert card["architecture"]["module"] == "fedssl.models.encoders.SmallCNN"
    assert card["params"]["method"]["federation"]["rounds"] == 2
    card_text = (project / "artifacts/exports/tiny_simclr/MODEL_CARD.md").read_text()
    assert "- method `fedsimclr`, rounds 2, local_epochs 1, batch_size 32, lr 0.001" in card_text
    assert card["code"]["torch"] == torch.__version__ and card["code"]["git"] is None
    assert set(card["trained_by"]) == {"prepare_data__tiny", "pretrain__tiny_simclr"}
    used = json.loads(
        (project / "artifacts/experiments/tiny_simclr/pretrain/meta.json").read_text()
    )
    assert used["precision"] in ("fp32", "bf16")  # bf16 on a CPU with native bf16
    assert card["trained_by"]["pretrain__tiny_simclr"]["precision"] == used["precision"]
    assert card["features_precision"] in ("fp32", "bf16")
    page = (project / "artifacts/exports/tiny_simclr/MODEL_CARD.md").read_text()
    for section in ("Architecture", "Input and normalisation", "Training data and partition"):
        assert f"## {section}\n" in page
    assert "`fedssl.models.encoders.SmallCNN`" in page and "partition `tiny_dir05_m3`" in page
    assert f"`pretrain__tiny_simclr` in {used['precision']}" in page and "rounds 2" in page
    assert f"| linear_top1 | {metrics['linear_top1']} |" in page
    assert "torch.export.load('encoder.pt2').module()" in page


def test_the_program_loads_with_torch_alone(project, monkeypatch, tmp_path):
    """In a fresh interpreter that cannot import fedssl: one line loads it, and its features
    equal those of the module fedssl rebuilds."""
    import subprocess
    import sys

    from fedssl.export import export, load_encoder

    monkeypatch.chdir(project)
    out = export("tiny_simclr", tmp_path / "enc")
    script = (
        "import sys, torch\n"
        "sys.path = [p for p in sys.path if p not in ('', '.')]\n"
        f"encoder = torch.export.load({str(out / 'encoder.pt2')!r}).module()\n"
        "x = torch.linspace(0, 1, 3 * 28 * 28).reshape(3, 1, 28, 28)\n"
        "with torch.no_grad():\n"
        f"    torch.save(encoder(x), {str(tmp_path / 'features.pt')!r})\n"
        "assert 'fedssl' not in sys.modules, 'fedssl was imported'\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, check=True)
    got = torch.load(tmp_path / "features.pt", weights_only=True)
    x = torch.linspace(0, 1, 3 * 28 * 28).reshape(3, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(got, load_encoder(out)(x))


def test_a_tampered_card_or_weights_file_is_refused(project, monkeypatch, tmp_path):
    from fedssl.export import export, load_encoder

    monkeypatch.chdir(project)
    out = export("tiny_random", tmp_path / "enc")
    card = json.loads((out / "encoder.json").read_text())
    card["builder"]["function"] = "os:system"
    (out / "encoder.json").write_text(json.dumps(card))
    with pytest.raises(ValueError, match="not the one method 'none' declares"):
        load_encoder(out)
    out = export("tiny_random", tmp_path / "enc")
    (out / "encoder.safetensors").write_bytes((out / "encoder.safetensors").read_bytes()[:-4])
    with pytest.raises(ValueError, match="sha256"):
        load_encoder(out / "encoder.json")


def test_an_untrained_experiment_names_the_stage_to_run(project, monkeypatch, capsys):
    from fedssl.export import run
    from fedssl.stage.context import main_guard

    monkeypatch.chdir(project)
    (project / "params" / "experiments" / "tiny_simclr3.yaml").write_text(
        "extends: tiny_simclr\nmethod: {federation: {rounds: 3}}\n"
    )
    monkeypatch.setattr("sys.argv", ["fedssl.export", "tiny_simclr3"])
    with pytest.raises(SystemExit) as exit_:
        main_guard(run)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "no trained 'pretrain' output" in err and "'pretrain__tiny_simclr3'" in err
    assert "Traceback" not in err
