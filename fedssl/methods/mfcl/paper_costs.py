"""The MFCL paper's client cost formulas (§5.4, Eqs. 4-6, Tab. 3), in its conventions.

Analytic formulas (paper convention; a cost row's ``paper_bits`` = α, ``paper_memory_bytes`` = γ
and ``flops`` = β counted, the names every method's costs share):

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
  The ``paper_*`` numbers follow the paper's counting; use
  :func:`fedssl.costs.tensor_bytes` on the tensors
  actually sent for the physical byte count (``bytes_exchanged``).
* **Phase-1 payload.** Alg. 1 sends the whole autoencoder (encoder + decoder) both ways, so the
  default is |θ_fed| = |θ_m| = autoencoder size. (Tab. 3's "11×10⁶" MFCL cell is only matched by
  "download the autoencoder, upload the encoder" -- see the tests; we do not adopt it.)
* **Eq. 6** is implemented literally, including the odd scaling of the parameter and gradient
  counts by the batch size 2K. Tab. 3's MFCL "11×10⁷" is reproduced when |θ_m| = |g_m| = encoder
  parameters and Σ_l |w_l| = the encoder's conv output maps per image (spec §5 [I]).

The end-to-end baselines of Tab. 3 (FedSimCLR) are costed with the same conventions, by the
library (:mod:`fedssl.costs.end_to_end`: the code rate, Eq. 4's traffic and Eq. 6's memory,
which MFCL's formulas here compose). The measured meters (FLOPs, saved activations, bytes) are
the library's, :mod:`fedssl.costs`.
"""

from __future__ import annotations

from torch import Tensor, nn

from fedssl.costs import (
    BITS_PER_FLOAT,
    conv_feature_map_numels,
    forward_flops,
    measured_step_bytes,
    train_step_flops,
)
from fedssl.costs.end_to_end import (
    DEFAULT_CODE_RATE,
    coded_bits,
    memory_bytes_eq6,
    phase1_bits,
)

#: Eq. 5 / §5.4: the paper's |z| per sample for ResNet-18 (32×32 spatial, 64 filters, pre-pool).
PAPER_REP_NUMEL_RESNET18 = 32 * 32 * 64


def phase2_bits(
    rep_numel_per_sample: int,
    n_samples: int,
    rho: int = 8,
    bits_per_value: int = BITS_PER_FLOAT,
    code_rate: float = DEFAULT_CODE_RATE,
) -> float:
    """Eq. 5: α₂ = (|z_m| · ρ) · 32 / R with |z_m| = ``rep_numel_per_sample`` · |D_m|.

    Paper convention: ``rep_numel_per_sample`` = :data:`PAPER_REP_NUMEL_RESNET18` and ρ = 8
    "vectors" of one such map per sample (see the module docstring).
    """
    return coded_bits(rep_numel_per_sample * n_samples * rho, bits_per_value, code_rate)


def mfcl_comm_costs(
    n_down: int,
    n_up: int,
    rounds: int,
    n_samples: int,
    rho: int = 8,
    rep_numel_per_sample: int = PAPER_REP_NUMEL_RESNET18,
    code_rate: float = DEFAULT_CODE_RATE,
) -> dict:
    """Tab. 3 communication cells of MFCL for one client:
    ``bits_p1`` (Eq. 4 per round), ``rounds``, ``rep_size`` (|z_m| · ρ values), ``bits_p2`` (Eq. 5)
    and ``alpha`` = α₁ (all rounds) + α₂."""
    bits_p1 = phase1_bits(n_down, n_up, 1, code_rate=code_rate)
    bits_p2 = phase2_bits(rep_numel_per_sample, n_samples, rho, code_rate=code_rate)
    return {
        "bits_p1": bits_p1,
        "rounds": rounds,
        "rep_size": rep_numel_per_sample * n_samples * rho,
        "bits_p2": bits_p2,
        "alpha": bits_p1 * rounds + bits_p2,
    }


def mfcl_client_flops(
    step_flops: float,
    steps_per_round: int,
    rounds: int,
    encoder_forward_flops_per_image: float,
    n_samples: int,
    views_per_sample: int = 16,
) -> float:
    """Total MFCL client compute: phase-1 training steps plus the one-shot export forward pass
    (``views_per_sample`` = 2ρ = 16 encoder forwards per local sample, §5.4)."""
    return (
        step_flops * steps_per_round * rounds
        + encoder_forward_flops_per_image * views_per_sample * n_samples
    )


def mfcl_client_costs(
    ae: nn.Module,
    probe: Tensor,
    loss_fn,
    batch_pairs: int,
    samples: list[int],
    rounds: list[int],
    local_epochs: int,
    pairs: int,
    dropped: list[bool],
    bytes_exchanged: list[int],
    rep_numel_paper: int,
    code_rate: float = DEFAULT_CODE_RATE,
) -> list[dict]:
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
    for m, (n, r, drop, b) in enumerate(zip(samples, rounds, dropped, bytes_exchanged)):
        comm = mfcl_comm_costs(n_ae, n_ae, r, 0 if drop else n, pairs, rep_numel_paper, code_rate)
        flops = step_per_pair * n * local_epochs * r + (0 if drop else export_per_pair * pairs * n)
        rows.append(
            {
                "client": m,
                "samples": n,
                "rounds": r,
                "dropped": drop,
                "paper_bits": comm["alpha"],
                "bits_p1_per_round": comm["bits_p1"],
                "bits_p2": comm["bits_p2"],
                "bytes_exchanged": b,
                "flops": flops,
                "paper_memory_bytes": eq6,
                "peak_step_bytes": peak,
            }
        )
    return rows
