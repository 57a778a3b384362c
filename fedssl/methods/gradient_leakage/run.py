"""MpFedcon's gradient-leakage study (§4.4, §5.10, Fig. 10, Tab. 4) as the ``attack`` step.

For every setting (cl = FC layers the party keeps, at = FC layers the attacker assumes, noise
on the shared gradients) and a seeded set of test images, one image at a time on a freshly
initialised sigmoid LeNet (iDLG's setting; a new random network per image):

* the iDLG label rule (Eq. 8) on the last FC weight gradient the attacker receives: the label
  hit rate over ``label_images`` images (when no FC gradient is shared the attacker can only
  guess: a seeded uniform guess);
* DLG's label (the argmax of its optimised dummy label) after a short L-BFGS run, over
  ``recon_label_images`` images;
* DLG and iDLG reconstructions by L-BFGS (lr 1) of ``recon_images`` images: the MSE between the
  dummy and the real image (both in [0, 1]) at every iteration, and the reconstruction the
  attacker keeps, the iterate with the lowest gradient-matching loss, with its MSE
  (``final_mse``; see :func:`fedssl.attacks.leakage.gradient_attack`).

Writes the per-setting metrics (``metrics.json``), the mean MSE curves (``mse_curves.tsv``) and
a picture of the reconstructions (``reconstructions.png``) into the experiment's results, and
every number per image into ``leakage.json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedssl.attacks.leakage import (
    add_gradient_noise,
    attacker_model,
    client_gradients,
    gradient_attack,
    infer_label_from_gradients,
)
from fedssl.models.cnn import LeNet
from fedssl.stage.runtime import derive_seed, numpy_rng, torch_save, write_json, write_tsv

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


def lenet(p, num_classes: int, shape: tuple[int, int, int], seed: int) -> nn.Sequential:
    """iDLG's LeNet with weights ~ U(-r, r) drawn from ``seed``, as an ``nn.Sequential`` (the
    layout the attacks read FC layers from)."""
    torch.manual_seed(seed)
    net = LeNet(num_classes, shape, hidden=p.fc_hidden, init_range=p.init_range)
    return nn.Sequential(*net.features, *net.classifier)


def attack_images(ctx: StepContext, p) -> tuple[torch.Tensor, np.ndarray]:
    """``max(label_images, recon_images, recon_label_images)`` seeded test images as float
    [N, C, S, S] in [0, 1] (resized to ``image_size`` when set), and their labels."""
    images, labels = ctx.split("test")
    n = max(p.label_images, p.recon_images, p.recon_label_images)
    pick = np.sort(numpy_rng(p.seed, "leakage-images").choice(len(labels), n, replace=False))
    x = torch.from_numpy(np.asarray(images[pick])).float() / 255.0
    if p.image_size is not None and x.shape[-1] != p.image_size:
        x = F.interpolate(
            x, size=(p.image_size, p.image_size), mode="bilinear", align_corners=False
        )
    return x, np.asarray(labels)[pick]


def shared_gradients(model, image, label: int, setting, seed: int) -> dict:
    grads = client_gradients(model, image, label, setting.hidden_fc)
    if setting.noise is not None:
        grads = add_gradient_noise(grads, setting.noise.kind, setting.noise.variance, seed)
    return grads


def idlg_label(model, grads: dict, num_classes: int, seed: int) -> tuple[int, bool]:
    """(the attacker's label, whether it was a blind guess: no FC weight gradient shared)."""
    try:
        return infer_label_from_gradients(model, grads) % num_classes, False
    except ValueError:
        return int(numpy_rng(seed, "guess").integers(num_classes)), True


@dataclass
class _Victims:
    """One setting's victims: image ``i`` on its own seeded LeNet with the gradients its party
    shares, and the attacker's copy of that network (the hidden layers guessed)."""

    p: object
    setting: object
    x: torch.Tensor
    y: np.ndarray
    num_classes: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def victim(self, i: int):
        seed = derive_seed(self.p.seed, "lenet", i)
        model = lenet(self.p, self.num_classes, self.shape, seed)
        grads = shared_gradients(model, self.x[i : i + 1], int(self.y[i]), self.setting, seed)
        return seed, model, grads

    def surrogate(self, model, seed: int):
        return attacker_model(
            model,
            self.setting.hidden_fc,
            self.setting.assumed_fc,
            self.num_classes,
            seed=seed + 1,
            init_bound=self.p.init_range,
        )

    def dlg_label_hit(self, i: int) -> int:
        """Whether DLG's optimised dummy label names image ``i``'s after a short run."""
        seed, model, grads = self.victim(i)
        r = gradient_attack(
            self.surrogate(model, seed),
            grads,
            self.shape,
            self.num_classes,
            "dlg",
            iterations=self.p.dlg_label_iterations,
            lbfgs_max_iter=self.p.lbfgs_max_iter,
            seed=seed,
        )
        return int(r.label == self.y[i])

    def reconstructions(self, i: int) -> dict[str, dict]:
        """Attack -> image ``i``'s reconstruction by it, with its MSE curve."""
        p = self.p
        seed, model, grads = self.victim(i)
        surrogate = self.surrogate(model, seed)
        out = {}
        for attack in p.attacks:
            label = (
                idlg_label(model, grads, self.num_classes, seed)[0] if attack == "idlg" else None
            )
            r = gradient_attack(
                surrogate,
                grads,
                self.shape,
                self.num_classes,
                attack,
                label=label,
                iterations=p.iterations,
                lbfgs_max_iter=p.lbfgs_max_iter,
                seed=seed,
                true_image=self.x[i : i + 1],
            )
            out[attack] = {
                "image": i,
                "label": int(self.y[i]),
                "attacker_label": r.label,
                "diverged": r.diverged,
                "mse_curve": _padded(r.mse_curve, p.iterations),
                "final_mse": r.mse,
                "final_image": r.image.squeeze(0).clamp(0, 1).tolist(),
            }
        return out


def run_setting(p, setting, x: torch.Tensor, y: np.ndarray, num_classes: int) -> dict:
    """Every measurement of one setting (see the module docstring)."""
    victims = _Victims(p, setting, x, y, num_classes)
    out = {
        "idlg_label_hits": [],
        "blind_guess": False,
        "dlg_label_hits": [],
        "recon": {"idlg": [], "dlg": []},
    }
    for i in range(p.label_images):
        seed, model, grads = victims.victim(i)
        label, blind = idlg_label(model, grads, num_classes, seed)
        out["idlg_label_hits"].append(int(label == y[i]))
        out["blind_guess"] |= blind
    out["dlg_label_hits"] = [victims.dlg_label_hit(i) for i in range(p.recon_label_images)]
    for i in range(p.recon_images):
        for attack, result in victims.reconstructions(i).items():
            out["recon"][attack].append(result)
    return out


def _padded(curve: list[float], length: int) -> list[float]:
    """An MSE curve of ``length`` points: a diverged run keeps its last finite value (NaN when
    it diverged at once)."""
    curve = [c for c in curve if math.isfinite(c)]
    last = curve[-1] if curve else float("nan")
    return curve + [last] * (length - len(curve))


def describe(setting) -> str:
    """What the attacker receives, in words (the leakage table's second column)."""
    if setting.hidden_fc == 0:
        text = "all gradients (FedAvg)"
    else:
        guess = (
            "the true layout"
            if setting.assumed_fc is None
            else f"{setting.assumed_fc} FC layer{'s' * (setting.assumed_fc > 1)}"
        )
        text = (
            f"last {setting.hidden_fc} FC layer{'s' * (setting.hidden_fc > 1)} hidden "
            f"(cl={setting.hidden_fc}), attacker assumes {guess}"
        )
    if setting.noise is not None:
        text += f" + {setting.noise.kind} noise, variance {setting.noise.variance:g}"
    return text


def summarize(p, results: dict) -> tuple[dict, list[dict]]:
    """(flat metrics per setting, the mean MSE curve rows for the TSV)."""
    metrics: dict = {
        "images_label": p.label_images,
        "images_dlg_label": p.recon_label_images,
        "images_recon": p.recon_images,
        "iterations": p.iterations,
        "chance_label_hit": round(1.0 / results["_classes"], 4),
    }
    curves: dict[str, np.ndarray] = {}
    for s in p.settings:
        r, key = results[s.label], s.label
        metrics[f"about_{key}"] = describe(s)
        metrics[f"idlg_label_hit_{key}"] = round(float(np.mean(r["idlg_label_hits"])), 4)
        metrics[f"idlg_label_blind_{key}"] = r["blind_guess"]
        if r["dlg_label_hits"]:
            metrics[f"dlg_label_hit_{key}"] = round(float(np.mean(r["dlg_label_hits"])), 4)
        for attack, runs in r["recon"].items():
            if not runs:
                continue
            finals = np.array([run["final_mse"] for run in runs])
            metrics[f"{attack}_final_mse_{key}"] = float(f"{np.nanmean(finals):.4g}")
            metrics[f"{attack}_recovered_{key}"] = round(float(np.mean(finals < p.success_mse)), 4)
            first = [
                next((j + 1 for j, m in enumerate(run["mse_curve"]) if m < p.success_mse), None)
                for run in runs
            ]
            hit = [f for f in first if f is not None]
            metrics[f"{attack}_iters_to_recover_{key}"] = (
                round(float(np.mean(hit)), 1) if hit else None
            )
            curves[f"{attack}_{key}"] = np.nanmean([run["mse_curve"] for run in runs], axis=0)
    rows = (
        [
            {"iteration": j + 1, **{k: float(f"{c[j]:.6g}") for k, c in curves.items()}}
            for j in range(p.iterations)
        ]
        if curves
        else []
    )
    return metrics, rows


def plot_reconstructions(p, results: dict, x: torch.Tensor, path) -> None:
    """One row per setting: the true image, then each attack's final dummy (first image)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attacks = list(p.attacks)
    fig, axes = plt.subplots(
        len(p.settings),
        1 + len(attacks),
        figsize=(1.6 * (1 + len(attacks)), 1.6 * len(p.settings)),
        squeeze=False,
    )
    for row, s in enumerate(p.settings):
        shown = [("real", x[0])]
        for attack in attacks:
            runs = results[s.label]["recon"][attack]
            shown.append(
                (f"{attack} {runs[0]['final_mse']:.2g}", torch.tensor(runs[0]["final_image"]))
            )
        for col, (title, img) in enumerate(shown):
            ax = axes[row][col]
            ax.imshow(img.permute(1, 2, 0).squeeze(-1).numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(title, fontsize=7)
            if col == 0:
                ax.set_ylabel(s.label, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def finished_settings(ctx: StepContext) -> dict:
    """The settings a killed run of this very stage (same fingerprint) had finished."""
    if not ctx.resume_path.exists():
        return {}
    saved = torch.load(ctx.resume_path, weights_only=True)
    return saved["results"] if saved.get("fingerprint") == ctx.fingerprint else {}


def attack(ctx: StepContext) -> None:
    p = ctx.exp.method
    torch.set_num_threads(1)  # the double backward of a tiny net: one thread is fastest
    x, y = attack_images(ctx, p)
    _, train_labels = ctx.split("train")
    classes = int(max(train_labels.max(), y.max())) + 1
    results: dict = {"_classes": classes, **finished_settings(ctx)}
    for s in p.settings:
        if s.label in results:
            print(f"setting {s.label}: resuming, finished before the stop", flush=True)
            continue
        print(f"setting {s.label}: cl={s.hidden_fc} at={s.assumed_fc} noise={s.noise}", flush=True)
        results[s.label] = run_setting(p, s, x, y, classes)
        # each setting seeds every draw from its images' seeds: a resumed run redoes only the
        # settings after this checkpoint and gets the same numbers
        torch_save({"fingerprint": ctx.fingerprint, "results": results}, ctx.resume_path)
    metrics, rows = summarize(p, results)
    write_json(ctx.results_dir / "metrics.json", metrics)
    write_tsv(rows, ctx.results_dir / "mse_curves.tsv", list(rows[0]) if rows else ["iteration"])
    if p.recon_images:
        plot_reconstructions(p, results, x, ctx.results_dir / "reconstructions.png")
    write_json(
        ctx.out / "leakage.json",
        {
            "settings": [s.model_dump(mode="json") for s in p.settings],
            "images": p.label_images,
            "classes": classes,
            "results": {k: v for k, v in results.items() if k != "_classes"},
        },
    )
    ctx.info.update(metrics=metrics, rounds=0)
