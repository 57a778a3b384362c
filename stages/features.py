"""Stage: features of the frozen encoder for the labelled train and test splits, cached once."""
from __future__ import annotations

import numpy as np
import torch

from fedssl.data.partition import stratified_subset
from fedssl.data.store import load_split
from fedssl.eval.probes import extract_features
from fedssl.methods import mfcl
from fedssl.methods.fedsimclr import build_model
from fedssl.params import load_preset
from fedssl.pipeline import data_dir, experiment_dir
from fedssl.stage import main_guard, stage_run
from stages.common import parse_stage


def run(argv):
    dag, stage, name = parse_stage("features", argv, "a params/experiments/<name>.yaml preset")
    exp = load_preset("experiment", name)
    dataset = load_preset("partition", exp.partition).dataset
    with stage_run(dag, stage) as (_, out, device, info):
        ckpt = torch.load(f"{experiment_dir(name)}/pretrain/model.pt", map_location=device)
        if exp.pretrain.method == "mfcl":  # client module + MaxPool + rServer module (+ head)
            rserver = torch.load(f"{experiment_dir(name)}/rserver/model.pt", map_location=device)
            encoder = mfcl.frozen_encoder(exp, ckpt["model"], rserver["model"],
                                          ckpt["image_shape"], device)
        else:
            model = build_model(exp, ckpt["image_shape"], device)
            model.load_state_dict(ckpt["model"])
            encoder = model if exp.features.layer == "projection" else model.backbone
        arrays = {}
        for split in ("train", "test"):
            images, labels = load_split(data_dir(dataset), split)
            if split == "train" and exp.features.train_size:
                keep = stratified_subset(labels, exp.features.train_size, exp.pretrain.seed)
                images, labels = images[keep], labels[keep]
            arrays[f"{split}_x"] = extract_features(encoder, images, exp.features.batch_size,
                                                    device)
            arrays[f"{split}_y"] = labels
        np.savez(out / "features.npz", **arrays)
        info.update(dim=int(arrays["train_x"].shape[1]), train=len(arrays["train_y"]),
                    test=len(arrays["test_y"]))


if __name__ == "__main__":
    main_guard(run)
