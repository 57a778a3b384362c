"""Nothing is unpickled: every call in fedssl/ and stages/ that reads a pickle-capable file is
found from the code (AST) and must be safe by its arguments (`torch.load(weights_only=True)`,
`np.load` without `allow_pickle`); pickle, `torch.jit.load`, joblib, dill or unsafe YAML
loading may not appear at all, and an Unpickler subclass (the CIFAR reader's) must restrict the
globals it builds. Then, at every
one of those sites, a crafted pickle (one that would create a marker file when unpickled) is
placed at the path it reads and the smallest stage (or function) that reaches it is run: it
must refuse the file at that very site, and the marker must not appear."""

from __future__ import annotations

import ast
import pickle
import traceback
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

from fedssl.stage.runtime import StageFailed
from tests.fixtures import REPO, TINY_MFCL_EXPERIMENT, in_project, make_tiny_project, run_stage
from tests.lwfedssl_fixtures import TINY_PARTITION as LW_PARTITION
from tests.lwfedssl_fixtures import TINY_SCRATCH, tiny_text
from tests.methods.cpcfl.test_cpcfl import add_tiny_cpcfl
from tests.methods.mocosfl.test_mocosfl import TINY as TINY_MOCOSFL
from tests.methods.mpfedcon.test_mpfedcon_chain import EXPERIMENT as MPF_EXPERIMENT
from tests.methods.mpfedcon.test_mpfedcon_chain import LEAKAGE
from tests.methods.mpfedcon.test_mpfedcon_chain import PARTITION as SHARDS
from tests.methods.test_method_contract import experiment

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.timeout(600)]

# ------------------------------------------------------------------ the load sites, from the code
SAFE_BY_ARGUMENT = {
    "torch.load": ("weights_only", True),
    "torch.serialization.load": ("weights_only", True),
    "numpy.load": ("allow_pickle", False),
}
NEVER = {
    "pickle.load",
    "pickle.loads",
    "pickle.Unpickler",
    "torch.jit.load",
    "joblib.load",
    "dill.load",
    "dill.loads",
    "cloudpickle.load",
    "cloudpickle.loads",
    "pandas.read_pickle",
    "shelve.open",
    "marshal.load",
    "marshal.loads",
    "yaml.load",
    "yaml.unsafe_load",
    "yaml.full_load",
}


class Site(NamedTuple):
    key: str  # "file::function::callee", with "#n" for the n-th such call of a function
    file: str
    function: str
    first_line: int
    last_line: int
    call: ast.Call
    callee: str


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted name it stands for, from every import of a module."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = (
                    a.name if a.asname else a.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node: ast.AST, names: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return names.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, names)
        return base and f"{base}.{node.attr}"
    return None


def _functions(tree: ast.Module):
    """(qualified name, node) of every function, innermost last."""

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    yield name, child
                yield from visit(child, f"{name}.")
            else:
                yield from visit(child, prefix)

    yield from visit(tree, "")


def load_sites() -> list[Site]:
    """Every call of a loader that can unpickle, in the library and the stage scripts."""
    sites = []
    for path in sorted([*REPO.glob("fedssl/**/*.py"), *REPO.glob("stages/**/*.py")]):
        file = str(path.relative_to(REPO))
        tree = ast.parse(path.read_text(), file)
        names = _imports(tree)
        functions = list(_functions(tree))
        counts: dict[tuple, int] = {}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            callee = _dotted(node.func, names)
            if callee not in SAFE_BY_ARGUMENT and callee not in NEVER:
                continue
            owner = [n for n, f in functions if f.lineno <= node.lineno <= f.end_lineno]
            function = owner[-1] if owner else "<module>"
            counts[function, callee] = counts.get((function, callee), 0) + 1
            n = counts[function, callee]
            sites.append(
                Site(
                    f"{file}::{function}::{callee}" + (f"#{n}" if n > 1 else ""),
                    file,
                    function,
                    node.lineno,
                    node.end_lineno,
                    node,
                    callee,
                )
            )
    return sites


def is_safe(site: Site) -> bool:
    if site.callee in SAFE_BY_ARGUMENT:
        keyword, safe = SAFE_BY_ARGUMENT[site.callee]
        given = {k.arg: k.value for k in site.call.keywords}
        if keyword not in given:
            return not safe  # np.load refuses pickles unless asked; torch.load must be told
        value = given[keyword]
        return isinstance(value, ast.Constant) and value.value is safe
    return False


def test_every_load_site_is_safe_by_its_arguments():
    sites = load_sites()
    assert len(sites) >= 15  # the scan sees the known sites (a broken scan would see none)
    unsafe = [f"{s.file}:{s.first_line} {ast.unparse(s.call)}" for s in sites if not is_safe(s)]
    assert not unsafe, "loads that can unpickle arbitrary objects:\n" + "\n".join(unsafe)


def test_the_scan_flags_unsafe_loads(tmp_path, monkeypatch):
    """The scan itself: each unsafe form is flagged, each safe one passes."""
    code = (
        "import torch, pickle\nimport numpy as np\nfrom torch import load as tl\n"
        "def f(p):\n    torch.load(p)\n    torch.load(p, weights_only=False)\n"
        "    np.load(p, allow_pickle=True)\n    pickle.load(p)\n    tl(p)\n"
        "    torch.jit.load(p)\n    torch.load(p, weights_only=True)\n    np.load(p)\n"
    )
    (tmp_path / "fedssl").mkdir()
    (tmp_path / "fedssl" / "x.py").write_text(code)
    monkeypatch.setattr("tests.data.test_no_pickle.REPO", tmp_path)
    verdicts = [(s.first_line, is_safe(s)) for s in load_sites()]
    assert verdicts == [
        (5, False),
        (6, False),
        (7, False),
        (8, False),
        (9, False),
        (10, False),
        (11, True),
        (12, True),
    ]


def unpickler_classes() -> list[tuple[str, ast.ClassDef]]:
    out = []
    for path in sorted([*REPO.glob("fedssl/**/*.py"), *REPO.glob("stages/**/*.py")]):
        tree = ast.parse(path.read_text())
        names = _imports(tree)
        out += [
            (str(path.relative_to(REPO)), node)
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
            and any(
                _dotted(b, names) in ("pickle.Unpickler", "pickle._Unpickler") for b in node.bases
            )
        ]
    return out


def test_every_unpickler_subclass_restricts_the_globals_it_builds():
    classes = unpickler_classes()
    assert [(file, c.name) for file, c in classes] == [
        ("fedssl/data/sets/_torchvision.py", "ArraysOnlyUnpickler")
    ]  # a new one needs a test below
    for _, c in classes:
        assert "find_class" in {f.name for f in c.body if isinstance(f, ast.FunctionDef)}


# ------------------------------------------------------------------ crafted files at each site
class Payload:
    """What a crafted file could make an unpickler do: run code (here: create a file)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def craft(path: Path, marker: Path, npz_keys: tuple[str, ...] = ()) -> None:
    """A file at ``path``, in the format its suffix says, that creates ``marker`` if unpickled."""
    path.parent.mkdir(parents=True, exist_ok=True)
    bomb = np.array([Payload(marker)], dtype=object)
    if path.suffix == ".npy":
        np.save(path, bomb, allow_pickle=True)
    elif path.suffix == ".npz":
        np.savez(path, **{k: bomb for k in npz_keys})
    else:
        torch.save({"fingerprint": "crafted", "state": Payload(marker)}, path)
    assert path.exists()


def test_the_crafted_files_do_run_code_when_unpickled(tmp_path):
    """So the refusals below are meaningful: a plain unpickler runs each crafted file."""
    for name in ("a.pt", "a.npy"):
        marker = tmp_path / f"ran-{name}"
        craft(tmp_path / name, marker)
        if name.endswith(".pt"):
            torch.load(tmp_path / name, weights_only=False)
        else:
            np.load(tmp_path / name, allow_pickle=True)
        assert marker.exists()


class Exercise(NamedTuple):
    """Run stage ``kind`` of ``experiment`` with ``crafted`` (a path template) replaced by a
    crafted pickle, after writing the harmless files in ``plain`` (template -> array/object)."""

    kind: str
    experiment: str
    crafted: str
    plain: dict = {}
    npz_keys: tuple[str, ...] = ()


# A key is a load site, or "site@caller" when several stages reach one shared loader (the
# checkpoints of the engine and of the epoch loop all load through runtime.load_checkpoint).
# Templates: {resume} = artifacts/.resume/<stage name>, {data} / {partition} = the experiment's
# prepared data and partition, {in:KIND} = the output of its upstream stage of kind KIND.
MANIFEST = {"per_client": [{"client": 0, "dropped": False}]}
REPS = np.zeros((2, 1, 2, 4, 2, 2), np.float32)  # [N, rho, 2, C, H, W] pairs for the rServer
EXERCISES = {
    "fedssl/data/__init__.py::_load::numpy.load@images": Exercise(
        "pretrain", "tiny_simclr", "{data}/train_images.npy"
    ),
    "fedssl/data/__init__.py::_load::numpy.load@labels": Exercise(
        "pretrain", "tiny_simclr", "{data}/train_labels.npy"
    ),
    "fedssl/data/__init__.py::load_clients::numpy.load": Exercise(
        "pretrain",
        "tiny_simclr",
        "{partition}/clients.npz",
        npz_keys=("client_0", "client_1", "client_2"),
    ),
    "fedssl/stage/context.py::StageContext.server_indices::numpy.load": Exercise(
        "grow_1", "tiny_lw_fedssl", "{partition}/server.npy"
    ),
    "fedssl/stage/runtime.py::load_checkpoint::torch.load@engine": Exercise(
        "pretrain", "tiny_simclr", "{resume}.pt"
    ),
    "fedssl/models/encoders.py::load_encoder::torch.load": Exercise(
        "features", "tiny_simclr", "{in:pretrain}/model.pt"
    ),
    "fedssl/data/__init__.py::load_npz::numpy.load@evaluate": Exercise(
        "evaluate",
        "tiny_pixels",
        "{in:features}/features.npz",
        npz_keys=("train_x", "train_y", "test_x", "test_y"),
    ),
    "fedssl/stage/runtime.py::load_checkpoint::torch.load@finetune": Exercise(
        "finetune", "tiny_vit_scratch", "{resume}.pt"
    ),
    "fedssl/data/__init__.py::load_npz::numpy.load@personal": Exercise(
        "personal",
        "tiny_fedrep",
        "{in:train}/personal.npz",
        npz_keys=("accuracy", "choice", "labels", "probs"),
    ),
    "fedssl/stage/runtime.py::load_checkpoint::torch.load@cpcfl-pretrain": Exercise(
        "pretrain", "tiny_cpcfl", "{resume}.w16.pt"
    ),
    "fedssl/methods/cpcfl/encoder_source.py::pretrained_encoder::torch.load": Exercise(
        "cfl", "tiny_cpcfl", "{in:pretrain}/encoder.pt"
    ),
    "fedssl/methods/cpcfl/encoder_source.py::pretrained_encoder::numpy.load": Exercise(
        "cfl",
        "tiny_cpcfl",
        "{in:pretrain}/public.npy",
        plain={"{in:pretrain}/encoder.pt": {"encoder": {}}},
    ),
    "fedssl/methods/gradient_leakage/run.py::finished_settings::torch.load": Exercise(
        "attack", "tiny_leakage", "{resume}.pt"
    ),
    "fedssl/methods/lwfedssl/run.py::load_online::torch.load": Exercise(
        "grow_2", "tiny_lw_fedssl", "{in:grow_1}/model.pt"
    ),
    "fedssl/methods/mfcl/export.py::export::torch.load": Exercise(
        "export", "tiny_mfcl", "{in:pretrain}/model.pt"
    ),
    "fedssl/methods/mfcl/run.py::rserver::numpy.load": Exercise(
        "rserver",
        "tiny_mfcl",
        "{in:export}/client_0.npy",
        plain={"{in:export}/manifest.json": MANIFEST},
    ),
    "fedssl/stage/runtime.py::load_checkpoint::torch.load@rserver": Exercise(
        "rserver",
        "tiny_mfcl",
        "{resume}.pt",
        plain={"{in:export}/manifest.json": MANIFEST, "{in:export}/client_0.npy": REPS},
    ),
    "fedssl/methods/mfcl/run.py::deployed_encoder.load::torch.load": Exercise(
        "features", "tiny_mfcl", "{in:pretrain}/model.pt"
    ),
    "fedssl/methods/mocosfl/run.py::load_final::torch.load": Exercise(
        "features", "tiny_mocosfl", "{in:pretrain}/model.pt"
    ),
    "fedssl/eval/global_model.py::load_saved::torch.load": Exercise(
        "features", "tiny_fedavg", "{in:train}/model.pt"
    ),
    "fedssl/methods/fedbyol/model.py::load_online_encoder::torch.load": Exercise(
        "features", "tiny_fedbyol", "{in:pretrain}/model.pt"
    ),
    "fedssl/methods/orchestra/model.py::load_model::torch.load": Exercise(
        "features", "tiny_orchestra", "{in:pretrain}/model.pt"
    ),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A tiny project holding an experiment of every method with a load site."""
    root = make_tiny_project(tmp_path_factory.mktemp("no_pickle"), git=False)
    add_tiny_cpcfl(root)
    params = root / "params"
    files = {
        "partitions/tiny_iid_m3_srv.yaml": LW_PARTITION,
        "partitions/tiny_shards.yaml": SHARDS,
        "partitions/tiny_shards_m3.yaml": "dataset: tiny\nnum_clients: 3\nscheme: {kind: "
        "shards, classes_per_client: 2}\nserver_holdout: 40\n"
        "seed: 0\n",
        "experiments/tiny_lw_fedssl.yaml": tiny_text("lw_fedssl"),
        "experiments/tiny_vit_scratch.yaml": TINY_SCRATCH,
        "experiments/tiny_fedrep.yaml": MPF_EXPERIMENT.format(variant="fedrep", seed=0),
        "experiments/tiny_leakage.yaml": LEAKAGE,
        "experiments/tiny_mfcl.yaml": TINY_MFCL_EXPERIMENT.format(norm="gn", secure="false"),
        "experiments/tiny_mocosfl.yaml": TINY_MOCOSFL.format(title="m", variant="mocosfl", cut=1),
        "experiments/tiny_fedavg.yaml": experiment("supervised", variant="fedavg", mu=0.0),
        "experiments/tiny_fedbyol.yaml": experiment("fedbyol"),
        "experiments/tiny_orchestra.yaml": experiment("orchestra", rounds=1),
    }
    for name, text in files.items():
        (params / name).write_text(text)
    return root


def resolve(template: str, planned) -> Path:
    dag, spec = planned.dag, planned.spec
    ctx_dirs = {"resume": f"artifacts/.resume/{planned.name}"}
    for upstream in spec.upstream:
        up = dag.stages[upstream]
        ctx_dirs[f"in:{up.kind}"] = up.out
        if up.kind in ("prepare_data", "partition"):
            ctx_dirs["data" if up.kind == "prepare_data" else "partition"] = up.out
    for key, value in ctx_dirs.items():
        template = template.replace(f"{{{key}}}", value)
    assert "{" not in template, f"{template}: not an input of {planned.name}"
    return Path(template)


def refusing_site(error: BaseException, sites: list[Site]) -> str | None:
    """The load site whose call raised ``error``: the innermost frame in the project's code
    (this checkout's or the tiny project's copy), matched to the last load call of that
    function at or above the frame's line (a `.npz` member is refused when it is read, a line
    or two below its np.load)."""
    frames = [(f, f.filename.replace("\\", "/")) for f in traceback.extract_tb(error.__traceback__)]
    ours = [
        (f, name[name.rindex(part) + 1 :])
        for f, name in frames
        for part in ("/fedssl/", "/stages/")
        if part in name and not f.name.startswith("<")
    ]  # a comprehension's frame: its function's next
    if not ours:
        return None
    frame, file = ours[-1]
    here = [
        s
        for s in sites
        if s.file == file
        and s.first_line <= frame.lineno
        and frame.name == s.function.split(".")[-1]
    ]
    return max(here, key=lambda s: s.first_line).key if here else None


REFUSALS = (
    "refused unread",  # a checkpoint (fedssl.stage.runtime.load_checkpoint)
    "Weights only load failed",
    "allow_pickle",
    "Python objects in dtype",
    "refusing to unpickle",
)


def test_every_load_site_has_a_crafted_file_exercise():
    """A new load site needs an exercise above (found from the code, not from this list)."""
    assert {s.key for s in load_sites()} == {key.split("@")[0] for key in EXERCISES}


@pytest.mark.parametrize("key", sorted(EXERCISES))
def test_a_crafted_pickle_at_each_load_site_is_refused(project, key, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSSL_THREADS", "1")
    monkeypatch.setenv("FEDSSL_DEVICE", "cpu")
    # the stage runtime refuses an input that differs from what its producer recorded before
    # any load (tests/plan/test_reliability.py); here the load site itself must refuse the file
    monkeypatch.setattr("fedssl.stage.base.verify_inputs", lambda record: None)
    ex = EXERCISES[key]
    marker = tmp_path / "the-pickle-ran"
    with in_project(project) as planned_stage:
        planned = planned_stage(ex.kind, ex.experiment)
        for name in planned.spec.upstream:  # prepared data and partitions for real
            kind = planned.dag.stages[name].kind
            if (
                kind in ("prepare_data", "partition", "init")
                and not (Path(planned.dag.stages[name].out) / "meta.json").exists()
            ):
                run_stage(type(planned)(planned.dag, name), upstream=True)
        target = resolve(ex.crafted, planned)
        written = [target, *(resolve(t, planned) for t in ex.plain)]
        saved = {p: p.read_bytes() for p in written if p.exists()}
        try:
            for template, content in ex.plain.items():
                write_plain(resolve(template, planned), content)
            craft(target, marker, ex.npz_keys)
            with pytest.raises((pickle.UnpicklingError, ValueError, StageFailed)) as refused:
                run_stage(planned)
        finally:
            for p in written:
                p.unlink(missing_ok=True)
            for p, content in saved.items():
                p.write_bytes(content)
    assert any(text in str(refused.value) for text in REFUSALS), refused.value
    assert refusing_site(refused.value, load_sites()) == key.split("@")[0]
    assert not marker.exists()


def write_plain(path: Path, content) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, np.ndarray):
        np.save(path, content)
    elif path.suffix == ".json":
        path.write_text(json.dumps(content))
    else:
        torch.save(content, path)


@pytest.mark.parametrize("crafted", ["data_batch_1", "test_batch", "batches.meta"])
def test_a_crafted_pickle_in_a_cifar_folder_is_refused(tmp_path, crafted):
    """CIFAR's release is pickled: its reader builds numpy arrays and refuses anything else."""
    from fedssl.data.catalog import load_dataset
    from tests.formats import write_cifar10

    write_cifar10(tmp_path)
    assert len(load_dataset("cifar10", str(tmp_path))["test"].labels) == 2  # the real format
    marker = tmp_path / "the-pickle-ran"
    (tmp_path / "cifar-10-batches-py" / crafted).write_bytes(
        pickle.dumps({"data": Payload(marker)}, protocol=2)
    )
    with pytest.raises(pickle.UnpicklingError, match="refusing to unpickle"):
        load_dataset("cifar10", str(tmp_path))
    assert not marker.exists()
