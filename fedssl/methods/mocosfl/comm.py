"""Communication of split federated MoCo: the paper's formula (Fig. 3) and the exact bytes the
protocol sends, per client (spec monacosfl.md §5 and §8.6).

Paper (Fig. 3, one client, one epoch): O = (2·n_img·|h_cut| + n_sync·|φ^c|) floats × 4 bytes,
activations up plus gradients down, and the sync counted one way.

What the protocol here sends (float32), per client:

* up:   ``activations_query`` = n_img·|h_cut| (the online model's view), ``activations_key`` =
        n_img·|h_cut| (the momentum model's view), ``sync_online`` = n_sync·|φ^c|, and for
        MonAcoSFL ``sync_momentum`` = n_sync·|φ^c|; the symmetric loss sends no more (the server
        swaps the two sets of activations, as the authors' code does);
* down: ``gradients`` = n_img·|h_cut|, ``sync_online`` = (n_sync + n_catch_up)·|φ^c|, and
        for MonAcoSFL ``sync_momentum`` the same; n_catch_up counts the rounds a client starts
        by downloading the synced model(s) it missed while it was not sampled.
"""

from __future__ import annotations

# Ledger kinds (bytes per client and direction, from the tensors exchanged)
ACT_QUERY, ACT_KEY, GRADIENTS = "activations_query", "activations_key", "gradients"
SYNC_ONLINE, SYNC_MOMENTUM = "sync_online", "sync_momentum"

FLOAT_BYTES = 4
MIB = 2**20


def paper_bytes(n_img: int, act_numel: int, n_sync: int, client_numel: int) -> int:
    """Fig. 3: (2·n_img·|h| + n_sync·|φ^c|) × 4 bytes."""
    return (2 * n_img * act_numel + n_sync * client_numel) * FLOAT_BYTES


def protocol_bytes(
    n_img: int,
    act_numel: int,
    n_sync: int,
    n_catch_up: int,
    client_numel: int,
    align: bool,
) -> dict[str, dict[str, int]]:
    """The bytes by direction and kind that the protocol sends for one client."""
    act = n_img * act_numel * FLOAT_BYTES
    up = {ACT_QUERY: act, ACT_KEY: act}
    down = {GRADIENTS: act}
    if n_sync:
        up[SYNC_ONLINE] = n_sync * client_numel * FLOAT_BYTES
    if n_sync + n_catch_up:
        down[SYNC_ONLINE] = (n_sync + n_catch_up) * client_numel * FLOAT_BYTES
    if align:
        if n_sync:
            up[SYNC_MOMENTUM] = up[SYNC_ONLINE]
        if n_sync + n_catch_up:
            down[SYNC_MOMENTUM] = down[SYNC_ONLINE]
    return {"up": {k: v for k, v in up.items() if v}, "down": {k: v for k, v in down.items() if v}}


def check_ledger(
    ledger_summary: dict,
    images: list[int],
    syncs: list[int],
    catch_ups: list[int],
    act_numel: int,
    client_numel: int,
    align: bool,
) -> dict:
    """Per client: the bytes sent by kind (from the ledger), the protocol's formula, the
    paper's formula, and whether the first two agree to the byte."""
    rows, exact = [], True
    for row in ledger_summary["per_client"]:
        c = row["client"]
        n_img = images[c]
        expected = protocol_bytes(n_img, act_numel, syncs[c], catch_ups[c], client_numel, align)
        match = expected["up"] == row["up_by_kind"] and expected["down"] == row["down_by_kind"]
        exact &= match
        rows.append(
            {
                "client": c,
                "images": n_img,
                "syncs": syncs[c],
                "catch_ups": catch_ups[c],
                "up_by_kind": row["up_by_kind"],
                "down_by_kind": row["down_by_kind"],
                "expected": expected,
                "matches_formula": match,
                "bytes_total": row["bytes_up"] + row["bytes_down"],
                "paper_formula_bytes": paper_bytes(n_img, act_numel, syncs[c], client_numel),
            }
        )
    return {
        "per_client": rows,
        "exact": exact,
        "act_numel": act_numel,
        "client_numel": client_numel,
        "align": align,
    }


def comm_curve(backbone, image_shape, n_img: int, n_sync: int) -> list[dict]:
    """Fig. 3 per cut: the paper's formula split into its optimisation (activations up and
    gradients down) and synchronisation parts, in MiB, for ``backbone`` params at
    ``image_shape`` (e.g. 224 px with the ImageNet stem, 250 images, 10 syncs)."""
    import torch

    from fedssl.methods.mocosfl.nets import build_backbone

    with torch.device("meta"):
        net = build_backbone(backbone, image_shape[0])
    rows = []
    for cut in range(1, net.num_cuts + 1):
        client, _ = net.split(cut)
        act = 1
        for d in net.cut_activation_shape(cut, image_shape):
            act *= d
        numel = sum(p.numel() for p in client.parameters())
        opt = 2 * n_img * act * FLOAT_BYTES / MIB
        sync = n_sync * numel * FLOAT_BYTES / MIB
        rows.append(
            {
                "cut": cut,
                "layer": 2 * cut - 1 if backbone.arch == "resnet18" else None,
                "act_numel": act,
                "client_params": numel,
                "optimisation_MiB": opt,
                "sync_MiB": sync,
                "total_MiB": opt + sync,
            }
        )
    return rows
