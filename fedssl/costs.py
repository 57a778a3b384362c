"""Client-side cost accounting of the MFCL paper (§5.4, Eqs. 4-6, Tab. 3) plus measured meters.

Analytic formulas (paper convention, "bits_paper"):

* Eq. 4, phase-1 traffic:  α₁ = (|θ_fed| + |θ_m|) · 32 · T · (1/R)
* Eq. 5, phase-2 traffic:  α₂ = (|z_m| · ρ) · 32 · (1/R),   |z_m| = per-view size · |D_m|
* α = α₁ + α₂ (for end-to-end FL baselines: α = 2·|θ| · 32 · (1/R) · rounds)
* Eq. 6, memory:           γ = (|θ_m| + |g_m| + Σ_l |w_l|) · 2K · 4 bytes

Conventions (spec ``methods/mfcl.md`` §5 and §8 A3/A12):

* **Code rate.** Eqs. 4-5 are printed with a factor ``R = 1/3``, but every reproducible cell of
  Tab. 3 multiplies by ``3 = 1/R`` -- which is what a rate-1/3 channel code does (3 coded bits per
  information bit). The functions here take ``code_rate`` (default 1/3) and **divide** by it.
* **Representation size.** The paper counts one 32×32×64 (pre-MaxPool) map per "representation
  vector" (one view) and ρ = 8 vectors per sample (:data:`PAPER_REP_NUMEL_RESNET18`), although its
  prose says each vector holds two views and the model really exports 64×16×16 after the pool.
  The ``*_paper`` numbers follow the paper's counting; use :func:`tensor_bytes` on the tensors
  actually sent for the physical byte count (``bytes_actual``).
* **Phase-1 payload.** Alg. 1 sends the whole autoencoder (encoder + decoder) both ways, so the
  default is |θ_fed| = |θ_m| = autoencoder size. (Tab. 3's "11×10⁶" MFCL cell is only matched by
  "download the autoencoder, upload the encoder" -- see the tests; we do not adopt it.)
* **Eq. 6** is implemented literally, including the odd scaling of the parameter and gradient
  counts by the batch size 2K. Tab. 3's MFCL "11×10⁷" is reproduced when |θ_m| = |g_m| = encoder
  parameters and Σ_l |w_l| = the encoder's conv output maps per image (spec §5 [I]).

Measured meters: :func:`train_step_flops` / :func:`forward_flops` (``FlopCounterMode``; 1 MAC =
2 FLOPs) and :func:`saved_activation_bytes` (bytes autograd keeps for the backward pass).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Sequence

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from fedssl.data.catalog import TRAIN_SIZES
from fedssl.params import ParamsError

BITS_PER_FLOAT = 32
DEFAULT_CODE_RATE = 1.0 / 3.0
#: Eq. 5 / §5.4: the paper's |z| per sample for ResNet-18 (32×32 spatial, 64 filters, pre-pool).
PAPER_REP_NUMEL_RESNET18 = 32 * 32 * 64


def coded_bits(n_values: float, bits_per_value: int = BITS_PER_FLOAT,
               code_rate: float = DEFAULT_CODE_RATE) -> float:
    """Channel bits for ``n_values`` numbers of ``bits_per_value`` bits sent with a code of rate
    ``code_rate`` (information bits / coded bits): ``n · bits / R``."""
    if not 0.0 < code_rate <= 1.0:
        raise ValueError(f"code rate must be in (0, 1], got {code_rate}")
    return n_values * bits_per_value / code_rate


def phase1_bits(n_down: int, n_up: int, rounds: int, bits_per_value: int = BITS_PER_FLOAT,
                code_rate: float = DEFAULT_CODE_RATE) -> float:
    """Eq. 4: α₁ = (|θ_fed| + |θ_m|) · 32 · T / R, per client.

    ``n_down`` / ``n_up`` are the parameters received from / sent to the gServer each round.
    ``rounds=1`` gives Tab. 3's "#bits (p1)" column (per round). The same formula gives the
    traffic of end-to-end FL baselines (FedSimCLR, FedEMA) with n_down = n_up = model size.
    """
    return coded_bits((n_down + n_up) * rounds, bits_per_value, code_rate)


def phase2_bits(rep_numel_per_sample: int, n_samples: int, rho: int = 8,
                bits_per_value: int = BITS_PER_FLOAT,
                code_rate: float = DEFAULT_CODE_RATE) -> float:
    """Eq. 5: α₂ = (|z_m| · ρ) · 32 / R with |z_m| = ``rep_numel_per_sample`` · |D_m|.

    Paper convention: ``rep_numel_per_sample`` = :data:`PAPER_REP_NUMEL_RESNET18` and ρ = 8
    "vectors" of one such map per sample (see the module docstring).
    """
    return coded_bits(rep_numel_per_sample * n_samples * rho, bits_per_value, code_rate)


def e2e_comm_costs(n_params: int, rounds: int, code_rate: float = DEFAULT_CODE_RATE) -> dict:
    """Tab. 3 communication cells of an end-to-end FL method (whole model down and up per round)."""
    per_round = phase1_bits(n_params, n_params, 1, code_rate=code_rate)
    return {"bits_p1": per_round, "rounds": rounds, "rep_size": 0, "bits_p2": 0.0,
            "alpha": per_round * rounds}


def mfcl_comm_costs(n_down: int, n_up: int, rounds: int, n_samples: int, rho: int = 8,
                    rep_numel_per_sample: int = PAPER_REP_NUMEL_RESNET18,
                    code_rate: float = DEFAULT_CODE_RATE) -> dict:
    """Tab. 3 communication cells of MFCL for one client:
    ``bits_p1`` (Eq. 4 per round), ``rounds``, ``rep_size`` (|z_m| · ρ values), ``bits_p2`` (Eq. 5)
    and ``alpha`` = α₁ (all rounds) + α₂."""
    bits_p1 = phase1_bits(n_down, n_up, 1, code_rate=code_rate)
    bits_p2 = phase2_bits(rep_numel_per_sample, n_samples, rho, code_rate=code_rate)
    return {"bits_p1": bits_p1, "rounds": rounds,
            "rep_size": rep_numel_per_sample * n_samples * rho, "bits_p2": bits_p2,
            "alpha": bits_p1 * rounds + bits_p2}


def memory_bytes_eq6(n_params: int, n_grads: int, feature_map_numels: Iterable[int] | int,
                     batch_images: int, bytes_per_value: int = 4) -> float:
    """Eq. 6: γ = (|θ_m| + |g_m| + Σ_l |w_l|) · 2K · 4 bytes, taken literally.

    ``feature_map_numels`` are the per-image feature-map sizes |w_l| (an int is taken as their
    sum); ``batch_images`` is 2K (both views). Note the paper scales the parameter and gradient
    counts by 2K too; this is reproduced, not corrected.
    """
    total_maps = feature_map_numels if isinstance(feature_map_numels, int) else sum(feature_map_numels)
    return (n_params + n_grads + total_maps) * batch_images * bytes_per_value


def conv_feature_map_numels(module: nn.Module, example: Tensor,
                            layer_types: tuple[type, ...] = (nn.Conv2d, nn.ConvTranspose2d)) -> list[int]:
    """Per-image output sizes of every layer of ``layer_types`` in ``module`` (in call order),
    from one forward pass on ``example`` (batch dimension first; TN needs an even batch)."""
    sizes: list[int] = []

    def hook(_m, _inp, out):
        sizes.append(out[0].numel())

    handles = [m.register_forward_hook(hook) for m in module.modules() if isinstance(m, layer_types)]
    try:
        with torch.no_grad():
            module(example)
    finally:
        for h in handles:
            h.remove()
    return sizes


def _register_cpu_attention_flops() -> None:
    """FlopCounterMode knows the CUDA attention kernels but not the CPU one that
    ``scaled_dot_product_attention`` dispatches to on the CPU, whose two matmuls it would
    silently skip: give it (and its backward) the formulas of the CUDA flash kernel."""
    from torch.utils import flop_counter as fc
    aten = torch.ops.aten
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if forward is not None and forward not in fc.flop_registry:
        @fc.register_flop_formula(forward)
        def _forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
            return fc.sdpa_flop_count(query, key, value)
    if backward is not None and backward not in fc.flop_registry:
        @fc.register_flop_formula(backward)
        def _backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
            return fc.sdpa_backward_flop_count(grad_out, query, key, value)


_register_cpu_attention_flops()


def _default_loss(output, _inputs) -> Tensor:
    out = output if isinstance(output, Tensor) else output[0]
    return out.float().mean()


def train_step_flops(model: nn.Module, inputs: Tensor | Sequence[Tensor],
                     loss_fn: Callable[[object, object], Tensor] | None = None) -> int:
    """FLOPs of one forward + backward pass (no optimiser update), counted by
    ``torch.utils.flop_counter.FlopCounterMode`` (matmul/conv ops; 1 MAC = 2 FLOPs).

    ``loss_fn(output, inputs)`` maps the model output to a scalar (default: mean of the output).
    Gradients produced by the measurement are cleared (``.grad = None``) afterwards.
    """
    loss_fn = loss_fn or _default_loss
    args = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    counter = FlopCounterMode(display=False)
    try:
        with counter:
            loss = loss_fn(model(*args), inputs)
            loss.backward()
    finally:
        for p in model.parameters():
            p.grad = None
    return int(counter.get_total_flops())


def forward_flops(model: nn.Module, inputs: Tensor | Sequence[Tensor]) -> int:
    """FLOPs of one forward pass without autograd (e.g. the representation export)."""
    args = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(*args)
    return int(counter.get_total_flops())


def mfcl_client_flops(step_flops: float, steps_per_round: int, rounds: int,
                      encoder_forward_flops_per_image: float, n_samples: int,
                      views_per_sample: int = 16) -> float:
    """Total MFCL client compute: phase-1 training steps plus the one-shot export forward pass
    (``views_per_sample`` = 2ρ = 16 encoder forwards per local sample, §5.4)."""
    return (step_flops * steps_per_round * rounds
            + encoder_forward_flops_per_image * views_per_sample * n_samples)


def saved_activation_bytes(model: nn.Module, inputs: Tensor,
                           loss_fn: Callable[[object, object], Tensor] | None = None) -> int:
    """Bytes of the distinct tensors autograd saves for the backward pass during one forward
    (measured with ``torch.autograd.graph.saved_tensors_hooks``; shared storages counted once).
    Add parameter, gradient and optimiser-state bytes for a CPU peak-memory estimate."""
    loss_fn = loss_fn or _default_loss
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        s = t.untyped_storage()
        storages[s.data_ptr()] = max(storages.get(s.data_ptr(), 0), s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model(inputs), inputs)
    del loss
    # Parameters are saved by some ops too; they are not activations.
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in storages.items() if ptr not in param_ptrs)


def tensor_bytes(tensors: Iterable[Tensor]) -> int:
    """Σ numel · element_size: the physical size of what is actually sent ("bytes_actual")."""
    return sum(t.numel() * t.element_size() for t in tensors)


def table_format(x: float) -> str:
    """A number the way Tab. 3 prints it: two significant digits as ``"<mm>e<exp>"``
    (e.g. 2.1469e9 -> ``"21e8"``; zero -> ``"0"``)."""
    if x == 0:
        return "0"
    exp = math.floor(math.log10(abs(x))) - 1
    mant = round(x / 10 ** exp)
    if abs(mant) >= 100:  # rounding carried into a third digit
        mant, exp = round(mant / 10), exp + 1
    return f"{mant}e{exp}"


# ------------------------------------------------------------------ per-client cost summaries
# The pipeline's `costs` stage: α (bits, paper convention, and bytes actually exchanged), β
# (FLOPs counted with FlopCounterMode on a small probe batch, scaled per sample × the samples a
# client processes; convolution and matmul FLOPs are linear in the batch) and γ (Eq. 6 and a
# measured one-step figure). Same recipe for MFCL and the end-to-end baselines.
def measured_step_bytes(model: nn.Module, inputs: Tensor, loss_fn, optimizer_slots: int,
                        batch_scale: float = 1.0) -> int:
    """One local step's memory, measured: autograd's saved tensors (scaled from the probe batch
    to the real one by ``batch_scale``) + parameters, gradients and ``optimizer_slots`` state
    tensors per parameter (Adam 2, SGD-momentum 1)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    acts = saved_activation_bytes(model, inputs, loss_fn)
    return int(acts * batch_scale + params * (2 + optimizer_slots))


def mfcl_client_costs(ae: nn.Module, probe: Tensor, loss_fn, batch_pairs: int,
                      samples: list[int], rounds: list[int], local_epochs: int, pairs: int,
                      dropped: list[bool], bytes_actual: list[int], rep_numel_paper: int,
                      code_rate: float = DEFAULT_CODE_RATE) -> list[dict]:
    """Per-client MFCL costs. ``probe`` is a twin batch [2k, C, H, W] in [0, 1] (k pairs);
    ``ae`` the client autoencoder (``encode`` gives the exported representation)."""
    k = probe.shape[0] // 2
    step_per_pair = train_step_flops(ae, probe, loss_fn) / k
    export_per_pair = forward_flops(ae.encode, probe) / k
    enc = ae.encoder
    n_enc = sum(p.numel() for p in enc.parameters())
    n_ae = sum(p.numel() for p in ae.parameters())
    eq6 = memory_bytes_eq6(n_enc, n_enc, conv_feature_map_numels(enc, probe), 2 * batch_pairs)
    peak = measured_step_bytes(ae, probe, loss_fn, 2, batch_pairs / k)
    rows = []
    for m, (n, r, drop, b) in enumerate(zip(samples, rounds, dropped, bytes_actual)):
        comm = mfcl_comm_costs(n_ae, n_ae, r, 0 if drop else n, pairs, rep_numel_paper,
                               code_rate)
        flops = step_per_pair * n * local_epochs * r + (0 if drop else export_per_pair * pairs * n)
        rows.append({"client": m, "samples": n, "rounds": r, "dropped": drop,
                     "alpha_bits_paper": comm["alpha"], "bits_p1_per_round": comm["bits_p1"],
                     "bits_p2": comm["bits_p2"], "bytes_actual": b, "beta_flops": flops,
                     "gamma_eq6_bytes": eq6, "peak_step_bytes": peak})
    return rows


def e2e_client_costs(model: nn.Module, probe: Sequence[Tensor], loss_fn, batch_pairs: int,
                     samples: list[int], rounds: list[int], local_epochs: int,
                     bytes_actual: list[int], optimizer_slots: int,
                     code_rate: float = DEFAULT_CODE_RATE) -> list[dict]:
    """Per-client costs of an end-to-end FL method (FedSimCLR): the whole model both ways per
    round; ``probe`` = the two view batches [k, C, H, W] each; ``loss_fn(output, inputs)``."""
    k = probe[0].shape[0]
    both = torch.cat(list(probe))
    step_per_pair = train_step_flops(model, both, loss_fn) / k
    n_params = sum(p.numel() for p in model.parameters())
    eq6 = memory_bytes_eq6(n_params, n_params, conv_feature_map_numels(model, both),
                           2 * batch_pairs)
    peak = measured_step_bytes(model, both, loss_fn, optimizer_slots, batch_pairs / k)
    rows = []
    for m, (n, r, b) in enumerate(zip(samples, rounds, bytes_actual)):
        comm = e2e_comm_costs(n_params, r, code_rate)
        rows.append({"client": m, "samples": n, "rounds": r, "dropped": False,
                     "alpha_bits_paper": comm["alpha"], "bits_p1_per_round": comm["bits_p1"],
                     "bits_p2": 0.0, "bytes_actual": b,
                     "beta_flops": step_per_pair * n * local_epochs * r,
                     "gamma_eq6_bytes": eq6, "peak_step_bytes": peak})
    return rows


def summarize_client_costs(rows: list[dict], extra: tuple[str, ...] = ()) -> dict:
    """Mean over clients of every per-client number of the report's cost columns (those of
    Tab. 3 the rows have) and of the ``extra`` keys a method adds (``Method.cost_columns``)."""
    keys = ["alpha_bits_paper", "bytes_actual", "beta_flops", "gamma_eq6_bytes",
            "peak_step_bytes"]
    keys = [k for k in keys if all(k in r for r in rows)] + [k for k in extra if k not in keys]
    return {f"mean_{k}": sum(r[k] for r in rows) / len(rows) for k in keys
            if rows}


# ------------------------------------------------------------------ inputs of the recipes
PROBE_PAIRS = 4  # a step's FLOPs and activations are measured on this many pairs, then scaled


def probe_batch(shape, pairs: int = PROBE_PAIRS) -> Tensor:
    """A fixed batch of 2·pairs images in [0, 1] on which one step is measured."""
    return torch.rand((2 * pairs, *shape), generator=torch.Generator().manual_seed(0))


class ClientTraffic(NamedTuple):
    samples: list[int]
    rounds: list[int]
    sent: list[int]     # bytes up + down


def ledger_of(step_dir: Path, sizes: list[int]) -> ClientTraffic:
    """Clients' data sizes with their rounds and bytes (up + down) from a federated step's
    communication log (zeros when the step ran no rounds)."""
    path = Path(step_dir) / "communication.json"
    if not path.exists():
        return ClientTraffic(list(sizes), [0] * len(sizes), [0] * len(sizes))
    rows = json.loads(path.read_text())["per_client"]
    return ClientTraffic(list(sizes), [r["rounds"] for r in rows],
                         [r["bytes_up"] + r["bytes_down"] for r in rows])


def average_client_samples(part, dataset: str) -> int:
    """|D_m| of the average client of a partition preset, without splitting anything."""
    return min(part.subset or TRAIN_SIZES[dataset], TRAIN_SIZES[dataset]) // part.num_clients


# ------------------------------------------------------------------ LW-FedSSL (App. A, §5.2)
# The paper's cost conventions for layer-wise, progressive and end-to-end training of a ViT with
# MoCo v3 heads (spec methods/lw-fedssl.md §5):
# * FLOPs: the forward pass of ONE sample counted as fvcore does (a multiply-add is one "FLOP";
#   LayerNorm 5 per element; GELU, softmax, BatchNorm and additions not counted); trained parts
#   count 3x (backward = 2x forward), frozen ones 1x. Per round: the online branch (F, H, P) with
#   twice more for its trained part, the momentum branch (F_k, H_k), and the received global
#   encoder F where the alignment term needs it; one view per branch; summed over the rounds.
# * Communication: the encoder's tensors (patch embedding + blocks) down and up, fp32 (the
#   paper's "MB" are MiB); heads (and the final LayerNorm sent with them) excluded.
@dataclass(frozen=True)
class VitCostParts:
    """Per-sample forward counts (fvcore convention) and parameter counts of the parts of a
    ViT with MoCo v3 heads."""
    embed: int          # patch projection
    block: int          # one Transformer block
    norm: int           # the final LayerNorm
    projector: int      # H
    predictor: int      # P
    embed_params: int
    block_params: int

    def encoder(self, blocks: int) -> int:
        return self.embed + blocks * self.block + self.norm


def vit_cost_parts(image_size: int = 32, patch_size: int = 4, in_channels: int = 3,
                   width: int = 192, mlp_hidden: int = 768, cls_token: bool = False,
                   head_hidden: int = 4096, head_out: int = 256) -> VitCostParts:
    """ViT parts counted the way fvcore counts one sample: Linear in·out per token, the two
    attention matmuls T²·width each, LayerNorm 5·numel, the patch conv patches·C·p²·width."""
    patches = (image_size // patch_size) ** 2
    tokens = patches + int(cls_token)
    block = (tokens * width * 3 * width + 2 * tokens * tokens * width + tokens * width * width
             + 2 * tokens * width * mlp_hidden + 2 * 5 * tokens * width)
    block_params = (2 * 2 * width + width * 3 * width + 3 * width + width * width + width
                    + width * mlp_hidden + mlp_hidden + mlp_hidden * width + width)
    patch_pixels = in_channels * patch_size * patch_size
    return VitCostParts(
        embed=patches * patch_pixels * width, block=block, norm=5 * tokens * width,
        projector=width * head_hidden + head_hidden * head_hidden + head_hidden * head_out,
        predictor=head_out * head_hidden + head_hidden * head_out,
        embed_params=patch_pixels * width + width + width * int(cls_token),
        block_params=block_params)


@dataclass(frozen=True)
class GrowthPlan:
    """What a client of a layer-wise family method trains and exchanges at stage s (Tab. 2):
    ``grows`` (False: all S blocks from the first round, end-to-end), which blocks it
    ``trains`` / ``downloads`` / ``uploads`` ("all" existing blocks, or the newest "last"),
    and whether it runs the received encoder for an alignment term (``global_forward``). The
    patch embedding trains with the first block (and with every block when ``trains`` is all)."""
    grows: bool
    trains: str
    downloads: str
    uploads: str
    global_forward: bool = False

    def blocks(self, which: str, s: int, depth: int) -> int:
        """How many blocks ``which`` ("all" / "last") covers at stage s."""
        present = s if self.grows else depth
        return present if which == "all" else 1

    def embedding_moves(self, which: str, s: int) -> bool:
        return which == "all" or (self.grows and s == 1)


def growth_round_flops(plan: GrowthPlan, parts: VitCostParts, s: int, depth: int) -> int:
    """App. A: one client round at stage s, for one sample, in the paper's convention."""
    present = plan.blocks("all", s, depth)
    heads = parts.projector + parts.predictor
    online = parts.encoder(present) + heads
    trained = plan.blocks(plan.trains, s, depth) * parts.block + parts.norm + heads
    trained += parts.embed if plan.embedding_moves(plan.trains, s) else 0
    target = parts.encoder(present) + parts.projector
    aligned = parts.encoder(present) if plan.global_forward else 0
    return online + 2 * trained + target + aligned


def growth_round_params(plan: GrowthPlan, parts: VitCostParts, s: int, depth: int
                        ) -> tuple[int, int]:
    """Encoder parameters a client downloads and uploads in one round at stage s."""
    def moved(which):
        return (plan.blocks(which, s, depth) * parts.block_params
                + (parts.embed_params if plan.embedding_moves(which, s) else 0))
    return moved(plan.downloads), moved(plan.uploads)


def growth_schedule_costs(plan: GrowthPlan, parts: VitCostParts, rounds: Sequence[int],
                          bytes_per_value: int = 4) -> dict:
    """A client's totals over a schedule (``rounds[s-1]`` rounds at stage s; S = len(rounds)):
    FLOPs in the paper's convention and encoder bytes down / up."""
    depth = len(rounds)
    flops = down = up = 0
    for s, r in enumerate(rounds, start=1):
        flops += r * growth_round_flops(plan, parts, s, depth)
        d, u = growth_round_params(plan, parts, s, depth)
        down, up = down + r * d * bytes_per_value, up + r * u * bytes_per_value
    return {"flops": flops, "bytes_down": down, "bytes_up": up, "bytes": down + up}


def main(argv: list[str] | None = None) -> int:
    """``python -m fedssl.costs EXPERIMENT...``: the average client's projected full-scale
    costs of each experiment preset, as a Markdown table (nothing is run or written)."""
    ap = argparse.ArgumentParser(prog="python -m fedssl.costs", description=main.__doc__)
    ap.add_argument("experiments", nargs="+", help="params/experiments/<name>.yaml presets")
    names = ap.parse_args(argv).experiments
    print("| experiment | α bits (Eqs. 4-5) | MB sent | β FLOPs | γ Eq. 6 MB | step peak MB "
          "| other (method's own) |")
    print("|---|---|---|---|---|---|---|")
    from fedssl.methods import registry
    from fedssl.presets import Presets
    presets = Presets()
    for name in names:
        try:
            exp = presets.load("experiment", name)
            part = presets.load("partition", exp.partition)
            dataset = presets.load("dataset", part.dataset).name
        except ParamsError as e:
            print(e, file=sys.stderr)
            return 2
        c = registry.get(exp.method.name).projected_costs(exp, part, dataset)

        def cell(key, fmt):
            return fmt(c[key]) if key in c else ""
        shown = {"mean_alpha_bits_paper", "mean_bytes_actual", "mean_beta_flops",
                 "mean_gamma_eq6_bytes", "mean_peak_step_bytes"}
        other = ", ".join(f"{k.removeprefix('mean_')}={v:.4g}" for k, v in c.items()
                          if k not in shown)
        print(f"| {name} | {cell('mean_alpha_bits_paper', table_format)} "
              f"| {cell('mean_bytes_actual', lambda v: f'{v / 1e6:.4g}')} "
              f"| {cell('mean_beta_flops', table_format)} "
              f"| {cell('mean_gamma_eq6_bytes', lambda v: f'{v / 1e6:.3g}')} "
              f"| {cell('mean_peak_step_bytes', lambda v: f'{v / 1e6:.3g}')} | {other} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
