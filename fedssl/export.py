"""Take a trained encoder away: ``python -m fedssl.export EXPERIMENT [--out DIR]``.

Writes the frozen encoder the probes read (the method's ``encoder`` hook on the experiment's
trained artifacts) as ``encoder.safetensors`` beside ``encoder.json``, a card saying how to
rebuild it (the builder the method declares and its arguments), what it was trained on and how
well it did. Elsewhere, with fedssl installed::

    from fedssl.export import load_encoder
    encoder = load_encoder("artifacts/exports/fmnist_fedsimclr")  # a plain torch.nn.Module
    features = encoder(images)  # float images in [0, 1], [N, C, H, W] as the card says

Loading unpickles nothing: the weights are safetensors, the card is JSON, and the only code it
runs is the builder the card's method declares in this version of fedssl.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import subprocess
from pathlib import Path

from fedssl.methods import registry
from fedssl.plan.layout import ARTIFACTS
from fedssl.presets import Presets
from fedssl.runtime import StageFailed, write_json
from fedssl.stage import StageContext, main_guard

CARD, WEIGHTS = "encoder.json", "encoder.safetensors"
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
    write_json(out / CARD, card(ctx, experiment, encoder, out / WEIGHTS))
    return out


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
    for name in ctx.stage.upstream:
        stage = ctx.dag.stages[name]
        if not (Path(stage.out) / "meta.json").is_file():
            raise StageFailed(
                f"experiment '{experiment}' has no trained '{stage.kind}' output "
                f"({stage.out} is missing): run its stage '{name}' first, e.g. `snakemake "
                f"--cores all {name}` (add `--config pipeline=NAME` for a pipeline other "
                f"than default)"
            )
    return ctx


def card(ctx: StageContext, experiment: str, encoder, weights: Path) -> dict:
    """What the encoder is, how to rebuild it, and what made it."""
    import torch

    method, params = ctx.method, ctx.presets.load("experiment", experiment)
    shape = [int(d) for d in ctx.image_shape]
    with torch.no_grad():
        dim = int(encoder(torch.zeros(1, *shape)).shape[-1])
    part = ctx.partition
    trained = {
        n: json.loads((Path(ctx.dag.stages[n].out) / "meta.json").read_text())
        for n in ctx.stage.upstream
    }
    return {
        "format": FORMAT,
        "experiment": experiment,
        "title": params.title,
        "method": method.name,
        "label": method.row_label(params.method) or params.title,
        "architecture": {
            "module": f"{type(encoder).__module__}.{type(encoder).__qualname__}",
            "input": f"float images in [0, 1], shape [N, {', '.join(map(str, shape))}]",
            "output": f"features, shape [N, {dim}]",
            "feature_dim": dim,
            "layer": params.features.layer,
            "parameters": sum(p.numel() for p in encoder.parameters()),
        },
        "builder": {
            "function": method.encoder_builder,
            "params": params.method.model_dump(mode="json"),
            "image_shape": shape,
            "projection": params.features.layer == "projection",
        },
        "weights": {
            "file": weights.name,
            "sha256": _sha256(weights),
            "tensors": len(encoder.state_dict()),
        },
        "data": {
            "dataset": part.dataset,
            "dataset_params": ctx.presets.load("dataset", part.dataset).model_dump(mode="json"),
            "partition": params.partition,
            "partition_params": part.model_dump(mode="json"),
        },
        "params": params.model_dump(mode="json"),
        "trained_by": {
            n: {"fingerprint": m.get("fingerprint"), "output_digest": m.get("output_digest")}
            for n, m in trained.items()
        },
        "metrics": _metrics(ctx, experiment),
        "code": {
            "git": _git_version(),
            "torch": torch.__version__,
            "fedssl": _package_version("fedssl"),
            "safetensors": _package_version("safetensors"),
        },
    }


def _metrics(ctx: StageContext, experiment: str) -> dict | None:
    """The experiment's evaluation metrics, if it was evaluated."""
    for name in ctx.dag.of_experiment[experiment]:
        for path in map(Path, ctx.dag.stages[name].metrics):
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
    if builder["function"] != method.encoder_builder:
        raise ValueError(
            f"{folder / CARD}: builder {builder['function']!r} is not the one "
            f"method '{method.name}' declares ({method.encoder_builder!r}): "
            f"exported by another version of fedssl?"
        )
    weights = folder / info["weights"]["file"]
    if _sha256(weights) != info["weights"]["sha256"]:
        raise ValueError(f"{weights}: its sha256 differs from the card's (a different file?)")
    module_name, _, function = builder["function"].partition(":")
    build = getattr(importlib.import_module(module_name), function)
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
        f"wrote {out / WEIGHTS} and {out / CARD}: {arch['module']}, "
        f"{arch['parameters']:,} parameters, {arch['input']} -> {arch['output']}"
    )
    print(f"load it with: fedssl.export.load_encoder({str(out)!r})")


if __name__ == "__main__":
    main_guard(run)
