"""Tiny LW-FedSSL-family experiments for a tiny project (tests.fixtures.make_tiny_project):
a 3-block ViT of width 16 on 28x28 toy images, 3 clients and a 30-image server holdout."""

from __future__ import annotations

from pathlib import Path

TINY_PARTITION = """\
dataset: tiny
num_clients: 3
scheme: {kind: iid}
server_holdout: 30
seed: 0
"""

TINY_BASE = """\
title: {title}
partition: tiny_iid_m3_srv
method:
  name: {method}
  seed: 0
  vit: {{width: 16, depth: 3, heads: 2, mlp_ratio: 2.0, patch_size: 7, pool: cls,
        head_hidden: 32, head_out: 16}}
  federation: {{rounds: 1, local_epochs: 1, batch_size: 32, lr: 0.001, lr_schedule: cosine,
               weight_decay: 1.0e-5, momentum: 0.99, temperature: 0.2, client_fraction: 1.0}}
  augment: {{crop_scale: [0.5, 1.0], crop_ratio: [0.75, 1.3333], flip_p: 0.5, jitter_p: 0.8,
            brightness: 0.4, contrast: 0.4, saturation: 0.0, hue: 0.0, grayscale_p: 0.0,
            blur_p: 0.0, blur_sigma: [0.1, 2.0], solarize_p: 0.0}}
{extra}features: {{layer: backbone, train_size: null, batch_size: 256}}
linear_probe: {{epochs: 5, lr: 0.01, weight_decay: 0.0, batch_size: 64, standardize: true, seed: 0}}
knn: {{k: 5, temperature: 0.1}}
finetune: {{epochs: 2, warmup_epochs: 1, lr: 0.001, batch_size: 64, train_size: 80}}
"""

TINY_SCRATCH = """\
title: Scratch
partition: tiny_iid_m3_srv
method:
  name: vit_scratch
  seed: 0
  vit: {width: 16, depth: 3, heads: 2, mlp_ratio: 2.0, patch_size: 7, pool: cls,
        head_hidden: 32, head_out: 16}
features: {layer: backbone, train_size: null, batch_size: 256}
linear_probe: {epochs: 5, lr: 0.01, weight_decay: 0.0, batch_size: 64, standardize: true, seed: 0}
knn: {k: 5, temperature: 0.1}
finetune: {epochs: 2, warmup_epochs: 1, lr: 0.001, batch_size: 64, train_size: 80}
"""

TINY_EXTRAS = {
    "fedmoco": "",
    "fedmoco_lw": "  weight_transfer: true\n",
    "prog_fedssl": "  weight_transfer: true\n",
    "lw_fedssl": "  weight_transfer: true\n  alpha: 0.01\n"
    "  calibration: {enabled: true, timing: round_start}\n",
}
TITLES = {
    "fedmoco": "FedMoCo",
    "fedmoco_lw": "FedMoCo-LW",
    "prog_fedssl": "Prog-FedSSL",
    "lw_fedssl": "LW-FedSSL",
}


def tiny_text(method: str, extra: str = "") -> str:
    return TINY_BASE.format(title=TITLES[method], method=method, extra=TINY_EXTRAS[method] + extra)


def add_tiny_lw(root: Path, pipeline: str = "lw") -> list[str]:
    """Add the four methods and Scratch to a tiny project, in a pipeline of their own."""
    params = root / "params"
    (params / "partitions" / "tiny_iid_m3_srv.yaml").write_text(TINY_PARTITION)
    names = []
    for method in TITLES:
        name = f"tiny_{method}"
        (params / "experiments" / f"{name}.yaml").write_text(tiny_text(method))
        names.append(name)
    (params / "experiments" / "tiny_vit_scratch.yaml").write_text(TINY_SCRATCH)
    names.append("tiny_vit_scratch")
    with open(params / "pipelines.yaml", "a") as f:
        f.write(f"  {pipeline}: [{', '.join(names)}]\n")
    return names
