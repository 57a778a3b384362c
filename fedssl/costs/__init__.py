"""Client-side cost meters that every method's ``costs`` stage composes: FLOPs counted with
``FlopCounterMode`` (1 MAC = 2 FLOPs), the bytes autograd keeps for the backward pass, the bytes
actually sent, a step's measured memory, and the per-client summary the report reads.

A paper's own analytic formulas live with its method: MFCL's Eqs. 4-6 in
:mod:`fedssl.methods.mfcl.paper_costs`, LW-FedSSL's App. A in
:mod:`fedssl.methods.lwfedssl.paper_costs`; MFCL's Tab. 3 conventions for the end-to-end
baselines, which its formulas compose, in :mod:`fedssl.costs.end_to_end`. ``fedssl costs``
(:mod:`fedssl.projected_costs`, a face above the method registry) projects each experiment's
full-scale costs through its method's hook.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from fedssl.data.catalog import dataset_spec
from fedssl.params import federation_of

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

BITS_PER_FLOAT = 32


def conv_feature_map_numels(
    module: nn.Module,
    example: Tensor,
    layer_types: tuple[type, ...] = (nn.Conv2d, nn.ConvTranspose2d),
) -> list[int]:
    """Per-image output sizes of every layer of ``layer_types`` in ``module`` (in call order),
    from one forward pass on ``example`` (batch dimension first; TN needs an even batch)."""
    sizes: list[int] = []

    def hook(_m, _inp, out):
        sizes.append(out[0].numel())

    handles = [
        m.register_forward_hook(hook) for m in module.modules() if isinstance(m, layer_types)
    ]
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


def train_step_flops(
    model: nn.Module,
    inputs: Tensor | Sequence[Tensor],
    loss_fn: Callable[[object, object], Tensor] | None = None,
) -> int:
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


def saved_activation_bytes(
    model: nn.Module, inputs: Tensor, loss_fn: Callable[[object, object], Tensor] | None = None
) -> int:
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
    """Σ numel · element_size: the physical size of what is actually sent (``bytes_exchanged``
    sums it over what a client sent and received)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def table_format(x: float) -> str:
    """A number the way Tab. 3 prints it: two significant digits as ``"<mm>e<exp>"``
    (e.g. 2.1469e9 -> ``"21e8"``; zero -> ``"0"``)."""
    if x == 0:
        return "0"
    exp = math.floor(math.log10(abs(x))) - 1
    mant = round(x / 10**exp)
    if abs(mant) >= 100:  # rounding carried into a third digit
        mant, exp = round(mant / 10), exp + 1
    return f"{mant}e{exp}"


# ------------------------------------------------------------------ per-client cost summaries
# The pipeline's `costs` stage: per client, bits by its paper's formula (where the method has
# one), bytes actually exchanged (the ledger), FLOPs counted with FlopCounterMode on a small
# probe batch, scaled per sample × the samples a client processes (convolution and matmul FLOPs
# are linear in the batch), memory by its paper's formula and a measured one-step peak, under
# the same names for every method (a paper's own symbols head only its plugin's tables). How
# the report and the board show each (label, unit, scale) is declared in
# fedssl.evaluations.costs.
CLIENT_COSTS = (
    "paper_bits",
    "bytes_exchanged",
    "encoder_bytes_exchanged",
    "flops",
    "paper_memory_bytes",
    "peak_step_bytes",
)


def measured_step_bytes(
    model: nn.Module,
    inputs: Tensor,
    loss_fn,
    optimizer_slots: int,
    batch_scale: float = 1.0,
    trained_only: bool = False,
) -> int:
    """One local step's memory, measured: autograd's saved tensors (scaled from the probe batch
    to the real one by ``batch_scale``) + parameters, and a gradient and ``optimizer_slots``
    state tensors (Adam 2, SGD-momentum 1) per parameter (``trained_only``: per parameter that
    requires a gradient, e.g. BYOL's online network without its EMA target)."""
    params = tensor_bytes(model.parameters())
    trained = tensor_bytes(q for q in model.parameters() if q.requires_grad or not trained_only)
    acts = saved_activation_bytes(model, inputs, loss_fn)
    return int(acts * batch_scale + (params + trained * (1 + optimizer_slots)))


def optimizer_slots(block) -> int:
    """State tensors a federation block's client optimizer keeps per trained weight: Adam's two
    moments, SGD's momentum buffer where it has momentum, none for plain SGD."""
    if getattr(block, "optimizer", "sgd") == "adam":
        return 2
    return 1 if getattr(block, "momentum", 0.0) else 0


class LocalStep(NamedTuple):
    """A method's description of its local step for the meters: ``module``'s forward on
    ``probe`` runs one step, ``loss_fn(output, probe)`` maps its output to the loss (None: the
    mean), and the probe holds ``samples`` of the client's samples (what costs are per)."""

    module: nn.Module
    probe: Tensor
    samples: int
    loss_fn: Callable | None = None


def local_step_costs(step: LocalStep, block, trained_only: bool = False) -> tuple[float, int]:
    """What the federation block makes of a method's local step: (FLOPs a client spends per
    sample of its data in a round = one step's FLOPs per sample x ``local_epochs``, the step's
    memory at the block's ``batch_size`` with its optimizer's state)."""
    m, x, k, loss = step
    flops = train_step_flops(m, x, loss) / k * block.local_epochs
    slots = optimizer_slots(block)
    peak = measured_step_bytes(m, x, loss, slots, block.batch_size / k, trained_only)
    return flops, peak


def summarize_client_costs(rows: list[dict], extra: tuple[str, ...] = ()) -> dict:
    """Mean over clients of every per-client number of :data:`CLIENT_COSTS` the rows have and
    of the ``extra`` keys a method adds (``Method.cost_columns``): ``mean_<key>``."""
    keys = [k for k in CLIENT_COSTS if all(k in r for r in rows)]
    keys += [k for k in extra if k not in keys]
    return {f"mean_{k}": sum(r[k] for r in rows) / len(rows) for k in keys if rows}


# ------------------------------------------------------------------ inputs of the recipes
PROBE_PAIRS = 4  # a step's FLOPs and activations are measured on this many pairs, then scaled


def probe_batch(shape, pairs: int = PROBE_PAIRS) -> Tensor:
    """A fixed batch of 2·pairs images in [0, 1] on which one step is measured."""
    return torch.rand((2 * pairs, *shape), generator=torch.Generator().manual_seed(0))


class ClientTraffic(NamedTuple):
    samples: list[int]
    rounds: list[int]
    sent: list[int]  # bytes up + down


def ledger_of(step_dir: Path, sizes: list[int]) -> ClientTraffic:
    """Clients' data sizes with their rounds and bytes (up + down) from a federated step's
    communication log (zeros when the step ran no rounds)."""
    path = Path(step_dir) / "communication.json"
    if not path.exists():
        return ClientTraffic(list(sizes), [0] * len(sizes), [0] * len(sizes))
    rows = json.loads(path.read_text())["per_client"]
    return ClientTraffic(
        list(sizes), [r["rounds"] for r in rows], [r["bytes_up"] + r["bytes_down"] for r in rows]
    )


# The ledger's kinds (a strategy's ``traffic`` split) that hold the encoder's parameters and
# nothing else: a whole ``encoder``, or a ViT's ``blocks`` and patch ``embedding``. The heads
# a method trains on top (projector, predictor, MoCo's heads) travel under other kinds; a
# ledger of one kind (``model``: the whole network) does not tell the encoder apart.
ENCODER_KINDS = ("encoder", "blocks", "embedding")


def encoder_traffic(step_dirs: Iterable[Path]) -> list[int] | None:
    """Per client, the bytes of the encoder's parameters it sent and received over the
    federated steps in ``step_dirs`` (their ``communication.json`` ledgers, kinds of
    :data:`ENCODER_KINDS`); None where no ledger tells the encoder apart."""
    totals: list[int] | None = None
    for step_dir in step_dirs:
        path = Path(step_dir) / "communication.json"
        if not path.exists():
            continue
        by_kind = [
            [r.get(d, {}) for d in ("up_by_kind", "down_by_kind")]
            for r in json.loads(path.read_text())["per_client"]
        ]
        if not any(k in kinds for client in by_kind for kinds in client for k in ENCODER_KINDS):
            continue
        found = [sum(kinds.get(k, 0) for kinds in c for k in ENCODER_KINDS) for c in by_kind]
        totals = found if totals is None else [a + b for a, b in zip(totals, found, strict=True)]
    return totals


def add_encoder_bytes(rows: list[dict], step_dirs: Iterable[Path]) -> list[dict]:
    """The costs stage's rows with each client's ``encoder_bytes_exchanged``
    (:func:`encoder_traffic`, matched by the row's ``client``) where the ledgers tell the
    encoder apart; the rows as they were otherwise."""
    traffic = encoder_traffic(step_dirs)
    if traffic is None:
        return rows
    return [
        r | {"encoder_bytes_exchanged": traffic[r.get("client", i)]} for i, r in enumerate(rows)
    ]


def step_traffic(ctx: StepContext, step: str) -> ClientTraffic:
    """The clients' traffic in ``step`` of a costs stage's experiment (``ctx``: its step
    context), with their data sizes."""
    return ledger_of(ctx.input(step), [len(c) for c in ctx.clients()])


def traffic_costs(ctx: StepContext, rows, step: str = "pretrain") -> list[dict]:
    """The costs stage's rows of a method whose costs follow from its params, the image shape
    and the clients' traffic in ``step``: ``rows(params, shape, samples, rounds, sent)``."""
    t = step_traffic(ctx, step)
    return rows(ctx.exp.method, ctx.image_shape, t.samples, t.rounds, t.sent)


def client_rows(ledger: ClientTraffic, flops_per_sample_round: float, peak_step_bytes: int):
    """The costs stage's row per client of a federated step: its samples, rounds and bytes
    from the ledger, its FLOPs = FLOPs per sample and round × samples × rounds, and the step's
    memory."""
    return [
        {
            "client": m,
            "samples": n,
            "rounds": r,
            "bytes_exchanged": b,
            "flops": flops_per_sample_round * n * r,
            "peak_step_bytes": peak_step_bytes,
        }
        for m, (n, r, b) in enumerate(zip(ledger.samples, ledger.rounds, ledger.sent))
    ]


def average_client_samples(part, dataset: str) -> int:
    """|D_m| of the average client of a partition preset, without splitting anything."""
    train_size = dataset_spec(dataset).train_size
    return min(part.subset or train_size, train_size) // part.num_clients


def projection(client_costs: Callable, round_bytes: Callable, setup_rounds: int = 0) -> Callable:
    """A method's ``projected_costs`` hook read from its federation block: the average client
    at full scale takes its expected share of the rounds (``client_fraction`` x ``rounds``,
    plus ``setup_rounds`` every client is in), sends and receives ``round_bytes(params,
    shape)`` in each, and costs what the method's ``client_costs(params, shape, samples,
    rounds, sent)`` counts for those."""

    def projected_costs(exp, part, dataset: str) -> dict:
        p, shape = exp.method, dataset_spec(dataset).shape
        block = federation_of(p)
        n = average_client_samples(part, dataset)
        rounds = round(block.client_fraction * block.rounds) + setup_rounds
        sent = round_bytes(p, shape) * rounds
        return summarize_client_costs(client_costs(p, shape, [n], [rounds], [sent]))

    return projected_costs
