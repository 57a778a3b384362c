"""Take a trained encoder away: ``python -m fedssl.export EXPERIMENT [--out DIR]``.

Writes the frozen encoder the probes read (the method's ``encoder`` hook on the experiment's
trained artifacts) as ``encoder.safetensors`` beside ``encoder.json``, a card saying how to
rebuild it (the builder the method declares and its arguments), what it was trained on and how
well it did; ``encoder.pt2``, the same encoder as a ``torch.export`` program (graph and weights,
any batch size); and ``MODEL_CARD.md``, the card for people. Elsewhere, with torch alone::

    encoder = torch.export.load("encoder.pt2").module()
    features = encoder(images)  # float images in [0, 1], [N, C, H, W] as the card says

or, with fedssl installed, ``fedssl.export.load_encoder(folder)`` rebuilds the module from the
card and the safetensors. Loading unpickles nothing: the weights are safetensors, the card is
JSON, and the only code it runs is the builder the card's method declares in this version of
fedssl (``torch.export.load`` reads a graph and its weights, no Python code).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import warnings
from pathlib import Path

from fedssl.methods import registry
from fedssl.methods.hooks import resolve_hook
from fedssl.plan.layout import ARTIFACTS
from fedssl.presets import Presets, derived_from, overrides_of
from fedssl.stage.context import StageContext, main_guard
from fedssl.stage.runtime import StageFailed, write_json

CARD, WEIGHTS, PROGRAM, MODEL_CARD = (
    "encoder.json",
    "encoder.safetensors",
    "encoder.pt2",
    "MODEL_CARD.md",
)
FORMAT = "fedssl-encoder/1"


def default_dir(experiment: str) -> Path:
    return ARTIFACTS / "exports" / experiment


# ---------------------------------------------------------------------------- export
def export(experiment: str, out: Path | str | None = None) -> Path:
    """Write experiment ``experiment``'s trained encoder and its card into ``out`` (default
    ``artifacts/exports/<experiment>``); returns the folder."""
    import torch
    from safetensors.torch import save_file

    ctx = encoder_context(experiment)
    ctx.device = torch.device("cpu")
    encoder = ctx.method.encoder(ctx)
    # contiguous copies: safetensors refuses views and tensors that share memory
    state = {k: v.detach().cpu().contiguous().clone() for k, v in encoder.state_dict().items()}
    out = Path(out or default_dir(experiment))
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (WEIGHTS + ".tmp")
    save_file(state, tmp, metadata={"format": FORMAT, "card": CARD})
    os.replace(tmp, out / WEIGHTS)
    save_program(encoder, ctx.image_shape, out / PROGRAM)
    info = card(ctx, experiment, encoder, out / WEIGHTS)
    write_json(out / CARD, info)
    write_text(out / MODEL_CARD, model_card(info))
    return out


def save_program(encoder, image_shape, path: Path) -> None:
    """``encoder`` as a ``torch.export`` program taking any batch of images: a graph of ATen
    ops and the weights, loaded by ``torch.export.load(path).module()`` with no fedssl."""
    import torch

    example = torch.rand(2, *(int(d) for d in image_shape))
    program = torch.export.export(
        encoder.eval(), (example,), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},)
    )
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")  # torch warns on a name not *.pt2
    with warnings.catch_warnings():
        # a channels-last weight (as a bf16 run trains it) covers its storage in another
        # order, which torch's packer calls "no complete tensor" while it writes the right
        # bytes on the CPU (tests/eval/test_export.py loads the program: equal to the bit)
        warnings.filterwarnings("ignore", "No complete tensor found", UserWarning)
        torch.export.save(program, tmp)
    os.replace(tmp, path)


def write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def encoder_context(experiment: str) -> StageContext:
    """The context of the experiment's features stage, once its method is known to export an
    encoder and every input of that stage has been produced."""
    method = registry.get(Presets().load("experiment", experiment).method.name)
    if "features" not in method.evaluation_sections:
        raise StageFailed(
            f"experiment '{experiment}': method '{method.name}' has no frozen "
            f"encoder to export (it is evaluated by "
            f"{', '.join(method.evaluation_sections) or 'its own steps'})"
        )
    if method.encoder_builder is None:
        raise StageFailed(
            f"experiment '{experiment}': method '{method.name}' declares no "
            f"`encoder_builder`, so its encoder cannot be rebuilt from a card"
        )
    ctx = StageContext("features", experiment)
    for name, stage in ctx.record["inputs"].items():
        if not (Path(stage["out"]) / "meta.json").is_file():
            raise StageFailed(
                f"experiment '{experiment}' has no trained '{stage['kind']}' output "
                f"({stage['out']} is missing): run its stage '{name}' first, e.g. `snakemake "
                f"--cores all {name}` (add `--config pipeline=NAME` for a pipeline other "
                f"than default)"
            )
    return ctx


def card(ctx: StageContext, experiment: str, encoder, weights: Path) -> dict:
    """What the encoder is, how to rebuild it, and what made it."""
    import torch

    method, params = ctx.method, ctx.presets.load("experiment", experiment)
    shape = [int(d) for d in ctx.image_shape]
    return {
        "format": FORMAT,
        "experiment": experiment,
        "title": params.title,
        "method": method.name,
        "label": method.row_label(params.method) or params.title,
        "architecture": _architecture(encoder, shape, params.features.layer),
        "builder": {
            "function": str(method.encoder_builder),
            "params": params.method.model_dump(mode="json"),
            "image_shape": shape,
            "projection": params.features.layer == "projection",
        },
        "weights": {
            "file": weights.name,
            "sha256": _sha256(weights),
            "tensors": len(encoder.state_dict()),
        },
        "data": _training_data(ctx, params.partition),
        "params": params.model_dump(mode="json"),
        # an override run (``EXP@<hash>``): the experiment it derives from and what it set
        "derived_from": derived_from(experiment),
        "overrides": overrides_of(experiment),
        "trained_by": _trained_by(ctx),
        "features_precision": _features_precision(ctx),
        "metrics": _metrics(ctx, experiment),
        "code": {
            "git": _git_version(),
            "torch": torch.__version__,
            "fedssl": _package_version("fedssl"),
            "safetensors": _package_version("safetensors"),
        },
    }


def _architecture(encoder, shape: list[int], layer: str) -> dict:
    """The encoder's class, input and output (its feature size measured on a zero image)."""
    import torch

    with torch.no_grad():
        dim = int(encoder(torch.zeros(1, *shape)).shape[-1])
    return {
        "module": f"{type(encoder).__module__}.{type(encoder).__qualname__}",
        "input": f"float images in [0, 1], shape [N, {', '.join(map(str, shape))}]",
        "output": f"features, shape [N, {dim}]",
        "feature_dim": dim,
        "layer": layer,
        "parameters": sum(p.numel() for p in encoder.parameters()),
    }


def _training_data(ctx: StageContext, partition: str) -> dict:
    """The data set and partition the encoder was trained on, with their params."""
    part = ctx.partition
    return {
        "dataset": part.dataset,
        "dataset_params": ctx.presets.load("dataset", part.dataset).model_dump(mode="json"),
        "partition": partition,
        "partition_params": part.model_dump(mode="json"),
    }


def _trained_by(ctx: StageContext) -> dict:
    """Per training stage the card was made from: what identifies its output, and its precision."""
    trained = {
        n: json.loads((Path(stage["out"]) / "meta.json").read_text())
        for n, stage in ctx.record["inputs"].items()
    }
    return {
        n: {
            "fingerprint": m.get("fingerprint"),
            "output_digest": m.get("output_digest"),
            "precision": m.get("precision"),
        }
        for n, m in trained.items()
    }


def _features_precision(ctx: StageContext) -> str | None:
    """The precision the probes' features were computed in (None before the stage ran)."""
    meta = ctx.output_dir / "meta.json"
    return json.loads(meta.read_text()).get("precision") if meta.is_file() else None


def _metrics(ctx: StageContext, experiment: str) -> dict | None:
    """The experiment's evaluation metrics, if it was evaluated."""
    from fedssl.plan.dag import Dag

    dag = Dag(None, experiments=[experiment], presets=ctx.presets)
    for name in dag.of_experiment[experiment]:
        for path in map(Path, dag.stages[name].metrics):
            if path.name == "metrics.json" and path.is_file():
                return json.loads(path.read_text())
    return None


def _git_version() -> str | None:
    """The commit the code is at (``-dirty`` with uncommitted changes), None outside git."""
    try:
        proc = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=40"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def _package_version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ---------------------------------------------------------------------------- model card
def model_card(info: dict) -> str:
    """The JSON card as a Markdown page for people (``MODEL_CARD.md``)."""
    arch = info["architecture"]
    lines = [
        f"# {info['label']}: encoder of `{info['experiment']}`",
        "",
        f"{info['title']}. Exported by fedssl {info['code']['fedssl'] or '(not installed)'} at "
        f"commit `{info['code']['git'] or 'unknown'}` with torch {info['code']['torch']}.",
        *(
            ["", f"An override run of `{info['derived_from']}`: {_brief(info['overrides'])}."]
            if info.get("derived_from")
            else []
        ),
        "",
        "## Architecture",
        f"- module `{arch['module']}`, {arch['parameters']:,} parameters, output layer "
        f"`{arch['layer']}`",
        f"- input: {arch['input']}",
        f"- output: {arch['output']}",
        "",
        "## Input and normalisation",
        "- uint8 pixels divided by 255 and nothing else (no mean/std normalisation, no "
        "resize), at the data set's own size; the probes feed the test images unaugmented",
        "",
        *_training_lines(info),
        "",
        "## Probe metrics",
        *_metric_lines(info.get("metrics") or {}),
        "",
        "## Files and loading",
        f"- `{PROGRAM}`: with torch alone, `encoder = torch.export.load('{PROGRAM}').module()`",
        f"- `{info['weights']['file']}` (sha256 `{info['weights']['sha256']}`) and `{CARD}`: "
        "with fedssl, `fedssl.export.load_encoder(folder)`",
        "",
    ]
    return "\n".join(lines)


def _training_lines(info: dict) -> list[str]:
    """The model card's sections on the training data, the method and the precision used."""
    data, params = info["data"], info["params"]
    method = params["method"]
    # the federation settings sit in one block (a multi-phase method's under its phases)
    blocks = [method.get("federation")] + [
        phase.get("federation") for phase in (method.get("phases") or {}).values()
    ]
    settings = {**method, **next((b for b in blocks if b), {})}
    trained = "; ".join(
        f"`{n}` in {m['precision']}" for n, m in info["trained_by"].items() if m.get("precision")
    )
    return [
        "## Training data and partition",
        f"- data set `{data['dataset']}`: "
        + ", ".join(f"{k} {v}" for k, v in data["dataset_params"].items()),
        f"- partition `{data['partition']}`: "
        + ", ".join(f"{k} {_brief(v)}" for k, v in data["partition_params"].items()),
        "",
        "## Method and rounds",
        f"- method `{info['method']}`"
        + "".join(
            f", {k} {settings[k]}"
            for k in ("variant", "rounds", "local_epochs", "batch_size", "lr")
            if k in settings
        ),
        f"- seed {params.get('seed', method.get('seed', 'n/a'))}",
        "",
        "## Precision actually used",
        f"- training: {trained or 'fp32 (no device stage recorded one)'}",
        f"- features for the probes: {info.get('features_precision') or 'not computed yet'}",
    ]


def _metric_lines(metrics: dict) -> list[str]:
    """The numeric probe metrics as a table, or a line saying there are none yet."""
    numbers = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
    if not numbers:
        return ["not evaluated yet (run the experiment's `evaluate` stage)"]
    return ["| metric | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in numbers.items()]


def _brief(value) -> str:
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


# ---------------------------------------------------------------------------- loading
def load_encoder(path: Path | str):
    """The exported encoder in ``path`` (its folder, or its card or weights file) as a plain
    ``torch.nn.Module`` in eval mode with frozen weights, mapping float images in [0, 1] to
    features. Runs no pickle: the module is built by the builder the card's method declares
    (with the card's arguments; the global random state is left as it was) and the
    safetensors weights are loaded into it, strictly."""
    import torch
    from safetensors.torch import load_file

    folder = Path(path)
    folder = folder.parent if folder.is_file() else folder
    info = json.loads((folder / CARD).read_text())
    if info.get("format") != FORMAT:
        raise ValueError(f"{folder / CARD}: format {info.get('format')!r}, expected {FORMAT!r}")
    method, builder = registry.get(info["method"]), info["builder"]
    if builder["function"] != str(method.encoder_builder):
        raise ValueError(
            f"{folder / CARD}: builder {builder['function']!r} is not the one "
            f"method '{method.name}' declares ({str(method.encoder_builder)!r}): "
            f"exported by another version of fedssl?"
        )
    weights = folder / info["weights"]["file"]
    if _sha256(weights) != info["weights"]["sha256"]:
        raise ValueError(f"{weights}: its sha256 differs from the card's (a different file?)")
    build = resolve_hook(method.encoder_builder)
    params = method.params.model_validate(builder["params"])
    with torch.random.fork_rng(devices=[]):  # builders seed their initialisation
        encoder = build(params, tuple(builder["image_shape"]), builder["projection"])
    encoder.load_state_dict(load_file(weights), strict=True)
    return encoder.eval()


# ---------------------------------------------------------------------------- command line
def run(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="fedssl export", description=__doc__.split("\n")[0])
    ap.add_argument("experiment", help="a params/experiments preset (or grid member)")
    ap.add_argument(
        "--out", type=Path, help="folder to write (default: artifacts/exports/<experiment>)"
    )
    args = ap.parse_args(argv)
    out = export(args.experiment, args.out)
    info = json.loads((out / CARD).read_text())
    arch = info["architecture"]
    print(
        f"wrote {out / WEIGHTS}, {PROGRAM}, {CARD} and {MODEL_CARD}: {arch['module']}, "
        f"{arch['parameters']:,} parameters, {arch['input']} -> {arch['output']}"
    )
    print(f"load it with torch alone: torch.export.load({str(out / PROGRAM)!r}).module()")


if __name__ == "__main__":
    main_guard(run)
