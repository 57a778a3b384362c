"""Gradient leakage attacks (DLG, iDLG) and the defences MpFedcon compares (§4.4, §5.10).

Setting. A party computes the cross-entropy gradient of its model on one private image and
shares the gradients of its *shared* layers. MpFedcon's layered network keeps the last
``hidden_fc`` fully connected layers (its personal head) on the party, so their gradients
are never sent ("cl" in the paper). The attacker (the server) knows the shared weights, since
it sent them, but not the head: it guesses a head of ``assumed_fc`` FC layers ("at") with
weights of its own, and then

* **iDLG** reads the label off the last FC weight gradient it can see (Eq. 8: for one sample
  and non-negative inputs to that layer, only the true class's row has a negative sum), and
* **DLG / iDLG** reconstruct the image by L-BFGS on a dummy input (DLG also on a dummy soft
  label) so that the surrogate model's gradients match the shared ones.

When the head is hidden the last visible FC layer is not the classifier, and Eq. 9 says the
sign of its gradient depends on the unknown head weights, so the label rule reads noise.

Models are ``nn.Sequential``; their ``nn.Linear`` modules, counted from the end, are the FC
layers that ``hidden_fc`` / ``assumed_fc`` refer to.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Gradients = dict[str, torch.Tensor]

__all__ = [
    "AttackResult",
    "fc_positions",
    "split_head",
    "shared_parameter_names",
    "uniform_init_",
    "client_gradients",
    "add_gradient_noise",
    "infer_label_idlg",
    "infer_label_from_gradients",
    "attacker_model",
    "gradient_attack",
    "leakage_experiment",
]


# --------------------------------------------------------------------------- model layout
def fc_positions(model: nn.Sequential) -> list[int]:
    """Indices of the ``nn.Linear`` modules of ``model``, in order."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"leakage attacks need an nn.Sequential model, got {type(model).__name__}")
    return [i for i, m in enumerate(model) if isinstance(m, nn.Linear)]


def _head_start(model: nn.Sequential, hidden_fc: int) -> int:
    """Index of the first module of the private head (``len(model)`` when nothing is hidden)."""
    fcs = fc_positions(model)
    if not 0 <= hidden_fc <= len(fcs):
        raise ValueError(f"hidden_fc={hidden_fc} but the model has {len(fcs)} FC layers")
    return fcs[len(fcs) - hidden_fc] if hidden_fc else len(model)


def split_head(model: nn.Sequential, hidden_fc: int) -> tuple[nn.Sequential, nn.Sequential]:
    """(shared prefix, private head): the head starts at the ``hidden_fc``-th last FC layer.

    Both share modules with ``model`` (no copies).
    """
    start = _head_start(model, hidden_fc)
    return nn.Sequential(*model[:start]), nn.Sequential(*model[start:])


def shared_parameter_names(model: nn.Sequential, hidden_fc: int) -> list[str]:
    """Names (as in ``model.named_parameters()``) of the parameters whose gradients are sent."""
    start = _head_start(model, hidden_fc)
    return [name for name, _ in model.named_parameters() if int(name.split(".")[0]) < start]


def uniform_init_(model: nn.Module, bound: float = 0.5, seed: int = 0) -> nn.Module:
    """Draw every weight and bias from U(-bound, bound), the initialisation of DLG/iDLG's LeNet.

    Its gradients are large enough for L-BFGS matching to converge quickly; PyTorch's default
    fan-in scaling gives much flatter sigmoid networks.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=gen, dtype=p.dtype) * 2 * bound - bound)
    return model


# --------------------------------------------------------------------------- the party's side
def client_gradients(
    model: nn.Sequential, image: torch.Tensor, label: int, hidden_fc: int = 0
) -> Gradients:
    """Cross-entropy gradients of one labelled image, restricted to the shared parameters."""
    names = shared_parameter_names(model, hidden_fc)
    params = dict(model.named_parameters())
    loss = F.cross_entropy(model(image), torch.tensor([label], device=image.device))
    grads = torch.autograd.grad(loss, [params[n] for n in names])
    return {n: g.detach() for n, g in zip(names, grads)}


def add_gradient_noise(
    grads: Gradients, kind: Literal["gaussian", "laplace"], variance: float, seed: int = 0
) -> Gradients:
    """The noise defence of Table 4: i.i.d. zero-mean noise of the given variance per entry."""
    if variance < 0:
        raise ValueError(f"noise variance must be >= 0, got {variance}")
    gen = torch.Generator().manual_seed(seed)
    return {n: g + _noise(g, kind, variance, gen) for n, g in grads.items()}


def _noise(like: torch.Tensor, kind: str, variance: float, gen: torch.Generator) -> torch.Tensor:
    if kind == "gaussian":
        draw = torch.randn(like.shape, generator=gen, dtype=like.dtype) * math.sqrt(variance)
    elif kind == "laplace":
        # inverse CDF of Laplace(0, b) with variance 2 b^2
        b = math.sqrt(variance / 2)
        u = torch.rand(like.shape, generator=gen, dtype=like.dtype) - 0.5
        # rand can return exactly 0 (u = -0.5, log1p(-1) = -inf): keep |u| inside (0, 0.5)
        edge = 0.5 - torch.finfo(like.dtype).eps
        draw = -b * torch.sign(u) * torch.log1p(-2 * u.abs().clamp_max(edge))
    else:
        raise ValueError(f"unknown noise kind {kind!r}; use 'gaussian' or 'laplace'")
    return draw.to(like.device)


# --------------------------------------------------------------------------- label inference
def infer_label_idlg(weight_grad: torch.Tensor) -> int:
    """iDLG's rule (MpFedcon Eq. 8) on an FC weight gradient [outputs, inputs] of one sample.

    Row i equals (softmax_i - y_i) * h with h >= 0, so the true class is the one row whose
    entries are <= 0: the row with the smallest sum.
    """
    if weight_grad.ndim != 2:
        raise ValueError(f"expected a 2-D FC weight gradient, got shape {tuple(weight_grad.shape)}")
    return int(torch.argmin(weight_grad.sum(dim=1)))


def infer_label_from_gradients(model: nn.Sequential, grads: Gradients) -> int:
    """Apply the iDLG rule to the last FC layer whose weight gradient the attacker received.

    With the head hidden this is a hidden layer, not the classifier: the answer is then an
    index of a hidden unit, which is exactly the failure MpFedcon's Eq. 9 predicts.
    """
    for pos in reversed(fc_positions(model)):
        name = f"{pos}.weight"
        if name in grads:
            return infer_label_idlg(grads[name])
    raise ValueError("the shared gradients contain no FC weight; iDLG cannot infer a label")


# --------------------------------------------------------------------------- the attacker
def attacker_model(
    model: nn.Sequential,
    hidden_fc: int,
    assumed_fc: int | None,
    num_classes: int,
    seed: int = 0,
    init_bound: float = 0.5,
    assumed_width: int | None = None,
) -> nn.Sequential:
    """The attacker's surrogate: the shared prefix with its true weights, plus a guessed head.

    ``assumed_fc=None`` means the attacker guessed the head right (the real head's layout with
    weights of its own); an integer builds ``assumed_fc`` sigmoid-separated FC layers of width
    ``assumed_width`` (default: the prefix's output width) ending in ``num_classes`` outputs.
    With nothing hidden the surrogate is an exact copy of the party's model.
    """
    prefix, head = split_head(model, hidden_fc)
    if hidden_fc == 0:
        if assumed_fc not in (None, 0):
            raise ValueError(
                "with every gradient shared the attacker sees the whole model; "
                "assumed_fc must be None or 0"
            )
        return copy.deepcopy(model)
    if assumed_fc is None:
        guess = uniform_init_(copy.deepcopy(head), init_bound, seed)
    else:
        width_in = _linear_in_features(head)
        guess = _guessed_head(
            width_in, assumed_fc, assumed_width or width_in, num_classes, init_bound, seed
        )
    # Keep the prefix modules at their original indices so parameter names match the party's.
    return nn.Sequential(*copy.deepcopy(prefix), *guess)


def _linear_in_features(head: nn.Sequential) -> int:
    return next(m for m in head if isinstance(m, nn.Linear)).in_features


def _guessed_head(
    width_in: int, layers: int, width: int, num_classes: int, bound: float, seed: int
) -> nn.Sequential:
    if layers < 1:
        raise ValueError("with a hidden head the attacker must assume at least one FC layer")
    modules: list[nn.Module] = []
    for i in range(layers):
        last = i == layers - 1
        modules.append(nn.Linear(width_in if i == 0 else width, num_classes if last else width))
        if not last:
            modules.append(nn.Sigmoid())
    return uniform_init_(nn.Sequential(*modules), bound, seed)


@dataclass
class AttackResult:
    image: torch.Tensor  # the reconstruction: the dummy where the matching loss was lowest
    label: int  # label used (iDLG: inferred; DLG: argmax of the dummy label there)
    mse_curve: list[float] = field(default_factory=list)  # vs the true image, per iteration
    match_curve: list[float] = field(default_factory=list)  # gradient-matching loss
    diverged: bool = False  # L-BFGS produced a non-finite loss and was stopped
    mse: float = float("nan")  # the reconstruction's MSE to the true image (when given)


def _label_target(attack: str, surrogate, shared_grads, label, num_classes: int, gen):
    """The label the dummy image is matched under, as a function returning its soft target,
    and the label variables L-BFGS optimises: iDLG's fixed one-hot label (none to optimise),
    or DLG's dummy soft label (drawn from ``gen`` after the dummy image)."""
    if attack == "idlg":
        fixed = infer_label_from_gradients(surrogate, shared_grads) if label is None else label
        # With the head hidden the rule names a hidden unit, possibly >= num_classes; folding it
        # into range keeps the attack running with a label that is as good as a guess.
        fixed = fixed % num_classes
        return (lambda: F.one_hot(torch.tensor([fixed]), num_classes).float()), []
    if attack == "dlg":
        dummy_label = torch.randn((1, num_classes), generator=gen).requires_grad_(True)
        return (lambda: F.softmax(dummy_label, dim=-1)), [dummy_label]
    raise ValueError(f"unknown attack {attack!r}; use 'dlg' or 'idlg'")


def gradient_attack(
    surrogate: nn.Sequential,
    shared_grads: Gradients,
    image_shape: tuple[int, ...],
    num_classes: int,
    attack: Literal["dlg", "idlg"] = "idlg",
    label: int | None = None,
    iterations: int = 300,
    lbfgs_max_iter: int = 20,
    lr: float = 1.0,
    seed: int = 0,
    true_image: torch.Tensor | None = None,
) -> AttackResult:
    """Reconstruct one image by matching ``shared_grads`` with L-BFGS on a dummy input.

    ``surrogate`` comes from :func:`attacker_model`; only the parameters named in
    ``shared_grads`` are matched. iDLG fixes the label (``label``, or the iDLG rule on the
    shared gradients); DLG optimises a dummy soft label too. The attack is bounded by what the
    attacker can see: it stops when the matching loss turns non-finite, and its
    reconstruction is the iterate with the lowest matching loss, not the last one (a diverging
    L-BFGS run ends anywhere: a final MSE of 1e15 on one CPU was 1e19 on another). MSEs are of
    images clamped to the pixel range [0, 1], so they lie in [0, 1]. ``true_image`` only feeds
    the MSE curve and ``mse``; the attack never reads it.
    """
    surrogate = surrogate.eval()
    gen = torch.Generator().manual_seed(seed)
    dummy = torch.rand((1, *image_shape), generator=gen).requires_grad_(True)
    soft_target, label_variables = _label_target(
        attack, surrogate, shared_grads, label, num_classes, gen
    )
    match_loss = _matching_loss(surrogate, shared_grads, dummy, soft_target)
    opt = torch.optim.LBFGS([dummy, *label_variables], lr=lr, max_iter=lbfgs_max_iter)
    return _descend(opt, match_loss, dummy, soft_target, iterations, true_image)


def _matching_loss(surrogate, shared_grads: Gradients, dummy: torch.Tensor, soft_target):
    """The gradient-matching loss of the dummy: the squared distance between the gradients
    it gives the shared parameters and the shared gradients."""
    names = list(shared_grads)
    params = dict(surrogate.named_parameters())
    targets = [shared_grads[n].detach() for n in names]
    matched = [params[n] for n in names]

    def match_loss() -> torch.Tensor:
        log_probs = F.log_softmax(surrogate(dummy), dim=-1)
        loss = -(soft_target() * log_probs).sum(dim=-1).mean()
        grads = torch.autograd.grad(loss, matched, create_graph=True)
        return sum(((g - t) ** 2).sum() for g, t in zip(grads, targets))

    return match_loss


def _descend(opt, match_loss, dummy, soft_target, iterations: int, true_image) -> AttackResult:
    """Up to ``iterations`` L-BFGS steps on the matching loss, stopped when it turns
    non-finite; the result keeps the iterate with the lowest matching loss."""
    result = AttackResult(image=dummy.detach(), label=-1)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = match_loss()
        loss.backward()
        return loss

    def label_now() -> int:  # iDLG's one-hot target names its fixed label
        return int(soft_target().argmax())

    def mse(image: torch.Tensor) -> float:
        return float(F.mse_loss(image.clamp(0, 1), true_image))

    best = float("inf")
    result.label = label_now()
    for _ in range(iterations):
        loss = opt.step(closure)
        if not torch.isfinite(loss) or not torch.isfinite(dummy).all():
            result.diverged = True
            break
        # L-BFGS returns the loss before its step: score the iterate it reached
        with torch.enable_grad():
            reached = float(match_loss().detach())
        if not math.isfinite(reached):
            result.diverged = True
            break
        result.match_curve.append(reached)
        if true_image is not None:
            result.mse_curve.append(mse(dummy.detach()))
        if reached < best:
            best, result.image, result.label = reached, dummy.detach().clone(), label_now()
    if true_image is not None:
        result.mse = mse(result.image)
    return result


def leakage_experiment(
    model: nn.Sequential,
    image: torch.Tensor,
    label: int,
    num_classes: int,
    attack: Literal["dlg", "idlg"] = "idlg",
    hidden_fc: int = 0,
    assumed_fc: int | None = None,
    noise: tuple[Literal["gaussian", "laplace"], float] | None = None,
    iterations: int = 300,
    lbfgs_max_iter: int = 20,
    seed: int = 0,
) -> AttackResult:
    """One cl/at cell of MpFedcon Fig. 10 / Table 4: the party's shared gradients (plus noise,
    if ``noise=(kind, variance)``) attacked by DLG or iDLG; compare ``result.label`` to
    ``label`` for the label hit."""
    grads = client_gradients(model, image, label, hidden_fc)
    if noise is not None:
        grads = add_gradient_noise(grads, noise[0], noise[1], seed)
    surrogate = attacker_model(model, hidden_fc, assumed_fc, num_classes, seed)
    return gradient_attack(
        surrogate,
        grads,
        tuple(image.shape[1:]),
        num_classes,
        attack,
        iterations=iterations,
        lbfgs_max_iter=lbfgs_max_iter,
        seed=seed,
        true_image=image,
    )
