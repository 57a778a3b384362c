"""The client costs of an end-to-end federated method, which sends its whole model down and up
every round (FedSimCLR, MFCL's Tab. 3 baseline), counted in the conventions of MFCL's Tab. 3
(§5.4) and measured; MFCL's own formulas (:mod:`fedssl.methods.mfcl.paper_costs`) compose the
traffic and memory ones here.

* traffic, Eq. 4 with the whole model both ways:  α = 2·|θ| · 32 · (1/R) · rounds, where R = 1/3
  is the channel code rate every reproducible Tab. 3 cell **divides** by (``code_rate``);
* memory, Eq. 6 taken literally:  γ = (|θ| + |g| + Σ_l |w_l|) · 2K · 4 bytes;
* FLOPs and a step's peak memory measured on one real step (:mod:`fedssl.costs`).

:func:`client_costs` and :func:`projected_costs` are the `costs` stage's and the projection's
hooks of a contrastive model trained by NT-Xent (FedSimCLR, whatever strategy it runs under).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from fedssl.costs import (
    BITS_PER_FLOAT,
    conv_feature_map_numels,
    measured_step_bytes,
    optimizer_slots,
    probe_batch,
    projection,
    tensor_bytes,
    traffic_costs,
    train_step_flops,
)
from fedssl.losses import nt_xent
from fedssl.models.encoders import seeded_contrastive_model

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

DEFAULT_CODE_RATE = 1.0 / 3.0


def coded_bits(
    n_values: float, bits_per_value: int = BITS_PER_FLOAT, code_rate: float = DEFAULT_CODE_RATE
) -> float:
    """Channel bits for ``n_values`` numbers of ``bits_per_value`` bits sent with a code of rate
    ``code_rate`` (information bits / coded bits): ``n · bits / R``."""
    if not 0.0 < code_rate <= 1.0:
        raise ValueError(f"code rate must be in (0, 1], got {code_rate}")
    return n_values * bits_per_value / code_rate


def phase1_bits(
    n_down: int,
    n_up: int,
    rounds: int,
    bits_per_value: int = BITS_PER_FLOAT,
    code_rate: float = DEFAULT_CODE_RATE,
) -> float:
    """Eq. 4: α₁ = (|θ_fed| + |θ_m|) · 32 · T / R, per client.

    ``n_down`` / ``n_up`` are the parameters received from / sent to the gServer each round.
    ``rounds=1`` gives Tab. 3's "#bits (p1)" column (per round). The same formula gives the
    traffic of end-to-end FL baselines (FedSimCLR, FedEMA) with n_down = n_up = model size.
    """
    return coded_bits((n_down + n_up) * rounds, bits_per_value, code_rate)


def e2e_comm_costs(n_params: int, rounds: int, code_rate: float = DEFAULT_CODE_RATE) -> dict:
    """Tab. 3 communication cells of an end-to-end FL method (whole model down and up per round)."""
    per_round = phase1_bits(n_params, n_params, 1, code_rate=code_rate)
    return {
        "bits_p1": per_round,
        "rounds": rounds,
        "rep_size": 0,
        "bits_p2": 0.0,
        "alpha": per_round * rounds,
    }


def memory_bytes_eq6(
    n_params: int,
    n_grads: int,
    feature_map_numels: Iterable[int] | int,
    batch_images: int,
    bytes_per_value: int = 4,
) -> float:
    """Eq. 6: γ = (|θ_m| + |g_m| + Σ_l |w_l|) · 2K · 4 bytes, taken literally.

    ``feature_map_numels`` are the per-image feature-map sizes |w_l| (an int is taken as their
    sum); ``batch_images`` is 2K (both views). Note the paper scales the parameter and gradient
    counts by 2K too; this is reproduced, not corrected.
    """
    total_maps = (
        feature_map_numels if isinstance(feature_map_numels, int) else sum(feature_map_numels)
    )
    return (n_params + n_grads + total_maps) * batch_images * bytes_per_value


def e2e_client_costs(
    model: nn.Module,
    probe: Sequence[Tensor],
    loss_fn,
    batch_pairs: int,
    samples: list[int],
    rounds: list[int],
    local_epochs: int,
    bytes_exchanged: list[int],
    optimizer_slots: int,
    code_rate: float = DEFAULT_CODE_RATE,
) -> list[dict]:
    """Per-client costs of an end-to-end FL method (FedSimCLR): the whole model both ways per
    round; ``probe`` = the two view batches [k, C, H, W] each; ``loss_fn(output, inputs)``."""
    k = probe[0].shape[0]
    both = torch.cat(list(probe))
    step_per_pair = train_step_flops(model, both, loss_fn) / k
    n_params = sum(p.numel() for p in model.parameters())
    eq6 = memory_bytes_eq6(
        n_params, n_params, conv_feature_map_numels(model, both), 2 * batch_pairs
    )
    peak = measured_step_bytes(model, both, loss_fn, optimizer_slots, batch_pairs / k)
    rows = []
    for m, (n, r, b) in enumerate(zip(samples, rounds, bytes_exchanged)):
        comm = e2e_comm_costs(n_params, r, code_rate)
        rows.append(
            {
                "client": m,
                "samples": n,
                "rounds": r,
                "dropped": False,
                "paper_bits": comm["alpha"],
                "bits_p1_per_round": comm["bits_p1"],
                "bits_p2": 0.0,
                "bytes_exchanged": b,
                "flops": step_per_pair * n * local_epochs * r,
                "paper_memory_bytes": eq6,
                "peak_step_bytes": peak,
            }
        )
    return rows


# ---------------------------------------------------------------------------- the hooks
def contrastive_client_costs(p, shape, samples: list[int], rounds: list[int], sent: list[int]):
    """Per-client costs of a contrastive model trained end to end by NT-Xent (params ``p``)."""
    model = seeded_contrastive_model(p.model, shape, p.seed, torch.device("cpu")).train()
    probe = probe_batch(shape)
    return e2e_client_costs(
        model,
        probe.chunk(2),
        lambda z, _x: nt_xent(*z.chunk(2), p.temperature),
        p.federation.batch_size,
        samples,
        rounds,
        p.federation.local_epochs,
        sent,
        optimizer_slots=optimizer_slots(p.federation),
    )


def client_costs(ctx: StepContext) -> list[dict]:
    """The `costs` stage's rows: each client's rounds and bytes from the pretraining ledger."""
    return traffic_costs(ctx, contrastive_client_costs)


def model_round_bytes(p, shape) -> int:
    """One client's round: the model state down and up."""
    state = seeded_contrastive_model(p.model, shape, p.seed, torch.device("cpu")).state_dict()
    return 2 * tensor_bytes(state.values())


# the average client at full scale: the model state down and up in each of its rounds
projected_costs = projection(contrastive_client_costs, model_round_bytes)
