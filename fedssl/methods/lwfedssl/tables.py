"""The report's table in the layout of LW-FedSSL's Tab. 3: accuracy beside the per-client
costs as ratios to FedMoCo (memory, FLOPs, communication), plus the absolute numbers."""

from __future__ import annotations

import statistics

from fedssl.reporting.formatting import markdown_table, mean_sd, number, numbers, sd_note

FAMILY = ("fedmoco", "fedmoco_lw", "lw_fedssl", "prog_fedssl", "vit_scratch")
TITLE = "LW-FedSSL Tab. 3 layout (per-client costs as ratios to FedMoCo)"


def _acc(rows, key) -> str:
    return mean_sd(numbers(rows, key), "sample")


def _mean(rows, key) -> float | None:
    values = numbers(rows, key)
    return statistics.mean(values) if values else None


# The costs shown as ratios to FedMoCo's: column -> row key.
COSTS = {
    "Mem": "peak_step_MB",
    "FLOPs": "paper_flops",
    "FLOPs (measured)": "client_GFLOPs",
    "Comm": "encoder_bytes",
    "Comm (blocks)": "block_bytes",
}
HEADER = [
    "Method",
    "runs",
    *COSTS,
    "Linear top-1",
    "Fine-tune top-1",
    "k-NN top-1",
    "peak MB",
    "FLOPs (paper conv.)",
    "encoder MiB",
]
NOTE = (
    "\nMem: the client's peak step memory (measured: saved activations at the batch "
    "size + every tensor of the learner + gradients and AdamW state of what trains). "
    "FLOPs: App. A's convention (one sample, forward counted as fvcore does, trained "
    "parts 3x, summed over rounds); measured: FlopCounterMode around a real local step "
    "x samples x epochs x rounds. Comm: encoder tensors (patch embedding + blocks) "
    "down and up, from the tensors exchanged; heads excluded; (blocks): the "
    "Transformer blocks alone.\n"
)


def _ratio(group, base, key) -> str:
    """The group's mean of ``key`` over FedMoCo's (blank without either)."""
    value, ref = _mean(group, key), _mean(base, key) if base else None
    return "" if value is None or not ref else number(value / ref, ".3f")


def _line(label: str, group: list[dict], base: list[dict] | None) -> list[str]:
    encoder_bytes = _mean(group, "encoder_bytes")
    return [
        label,
        str(len(group)),
        *(_ratio(group, base, key) for key in COSTS.values()),
        _acc(group, "linear_top1"),
        _acc(group, "finetune_top1"),
        _acc(group, "knn_top1"),
        number(_mean(group, "peak_step_MB"), ".3g"),
        number(_mean(group, "paper_flops"), ".3e"),
        number(None if encoder_bytes is None else encoder_bytes / 2**20, ".3g"),
    ]


def tab3(rows: list[dict]) -> dict[str, str]:
    mine = [r for r in rows if r.get("method") in FAMILY]
    if not mine:
        return {}
    labels = list(dict.fromkeys(r["row"] for r in mine))
    groups = {label: [r for r in mine if r["row"] == label] for label in labels}
    base = next((g for label, g in groups.items() if g[0]["method"] == "fedmoco"), None)
    lines = [_line(label, group, base) for label, group in groups.items()]
    caption = (
        "Accuracy as " + sd_note("sample") + "; Mem, FLOPs and Comm as ratios of the "
        "per-client means to FedMoCo's; then the absolute means"
    )
    return {TITLE: markdown_table(HEADER, lines, caption) + NOTE}
