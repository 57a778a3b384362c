"""The report's table in the layout of LW-FedSSL's Tab. 3: accuracy beside the per-client
costs as ratios to FedMoCo (memory, FLOPs, communication), plus the absolute numbers."""

from __future__ import annotations

import statistics

from fedssl.report_format import markdown_table, mean_sd, number, numbers, sd_note

FAMILY = ("fedmoco", "fedmoco_lw", "lw_fedssl", "prog_fedssl", "vit_scratch")
TITLE = "LW-FedSSL Tab. 3 layout (per-client costs as ratios to FedMoCo)"


def _acc(rows, key) -> str:
    return mean_sd(numbers(rows, key), "sample")


def _mean(rows, key) -> float | None:
    values = numbers(rows, key)
    return statistics.mean(values) if values else None


def tab3(rows: list[dict]) -> dict[str, str]:
    mine = [r for r in rows if r.get("method") in FAMILY]
    if not mine:
        return {}
    labels = list(dict.fromkeys(r["row"] for r in mine))
    groups = {label: [r for r in mine if r["row"] == label] for label in labels}
    base = next((g for label, g in groups.items() if g[0]["method"] == "fedmoco"), None)
    costs = {
        "Mem": "peak_step_MB",
        "FLOPs": "paper_flops",
        "FLOPs (measured)": "client_GFLOPs",
        "Comm": "encoder_bytes",
        "Comm (blocks)": "block_bytes",
    }

    def ratio(group, key) -> str:
        value, ref = _mean(group, key), _mean(base, key) if base else None
        return "" if value is None or not ref else number(value / ref, ".3f")

    header = [
        "Method",
        "runs",
        *costs,
        "Linear top-1",
        "Fine-tune top-1",
        "k-NN top-1",
        "peak MB",
        "FLOPs (paper conv.)",
        "encoder MiB",
    ]
    lines = []
    for label, group in groups.items():
        absolute = [
            _mean(group, "peak_step_MB"),
            _mean(group, "paper_flops"),
            _mean(group, "encoder_bytes"),
        ]
        cells = [
            label,
            str(len(group)),
            *(ratio(group, key) for key in costs.values()),
            _acc(group, "linear_top1"),
            _acc(group, "finetune_top1"),
            _acc(group, "knn_top1"),
            number(absolute[0], ".3g"),
            number(absolute[1], ".3e"),
            number(None if absolute[2] is None else absolute[2] / 2**20, ".3g"),
        ]
        lines.append(cells)
    note = (
        "\nMem: the client's peak step memory (measured: saved activations at the batch "
        "size + every tensor of the learner + gradients and AdamW state of what trains). "
        "FLOPs: App. A's convention (one sample, forward counted as fvcore does, trained "
        "parts 3x, summed over rounds); measured: FlopCounterMode around a real local step "
        "x samples x epochs x rounds. Comm: encoder tensors (patch embedding + blocks) "
        "down and up, from the tensors exchanged; heads excluded; (blocks): the "
        "Transformer blocks alone.\n"
    )
    caption = (
        "Accuracy as " + sd_note("sample") + "; Mem, FLOPs and Comm as ratios of the "
        "per-client means to FedMoCo's; then the absolute means"
    )
    return {TITLE: markdown_table(header, lines, caption) + note}
