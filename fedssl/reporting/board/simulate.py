"""Costs that decide: a line's total FLOPs (the client's and the server's on its behalf) and
a simulated wall time per round from its FLOPs and bytes on stated hardware, in place of the
measured wall seconds (on a shared CPU those are mostly contention: their CV reaches 0.66 at
equal compute).

A round's simulated time for the average client: its FLOPs of the round at the client's
rate, the server's FLOPs on its behalf at the server's rate, and its bytes of the round over
its link; no latency, no overlap of compute and transfer, no straggler (the mean client)."""

from __future__ import annotations

from dataclasses import dataclass

from fedssl.evaluations.costs import CLIENT_GFLOPS, CLIENT_MB_EXCHANGED


@dataclass(frozen=True)
class Profile:
    """A client's hardware: sustained training GFLOP/s and its link in Mbit/s."""

    words: str
    client_gflops_per_s: float
    link_mbit_per_s: float


SERVER_GFLOPS_PER_S = 10_000.0  # one server GPU, ~10 TFLOP/s sustained


# Two clients a deployment meets: a phone-class CPU (~20 GFLOP/s sustained in training) on a
# 10 Mbit/s link, and a workstation GPU (~5 TFLOP/s sustained on these small networks, a
# fraction of its peak) on 1 Gbit/s. Their ratios of compute to link differ (2 and 5 GFLOP a
# Mbit), so a line heavy in bytes and one heavy in FLOPs can swap places between them.
PROFILES = {
    "phone": Profile("phone-class client (20 GFLOP/s) on 10 Mbit/s", 20.0, 10.0),
    "workstation": Profile("workstation (5 TFLOP/s) on 1 Gbit/s", 5000.0, 1000.0),
}


TOTAL = "total_GFLOPs"


# The server's FLOPs on a client's behalf, where a method's costs stage reports them (its
# mean over clients, ``mean_server_flops``: a report row's ``server_flops``, in FLOPs), and
# the board's column of them in GFLOPs.
SERVER_FLOPS, SERVER_GFLOPS = "server_flops", "server_GFLOPs"


def column(profile: str) -> str:
    """The board column of a profile's simulated seconds per round."""
    return f"sim_s_{profile}"


def total_gflops(client: float | None, server: float | None) -> float | None:
    """The client's GFLOPs plus the server's on its behalf (none counted: zero)."""
    return None if client is None else client + (server or 0.0)


def round_seconds(
    client_gflops: float, server_gflops: float, mb: float, rounds: float, profile: Profile
) -> float | None:
    """Seconds of one round for a client of ``profile`` whose run costs ``client_gflops``,
    ``server_gflops`` on the server and ``mb`` MB exchanged over ``rounds`` rounds (None: no
    round)."""
    if not rounds:
        return None
    compute = client_gflops / profile.client_gflops_per_s + server_gflops / SERVER_GFLOPS_PER_S
    transfer = mb * 8 / profile.link_mbit_per_s
    return (compute + transfer) / rounds


def simulated(values: dict) -> dict[str, float]:
    """A run's board values' total GFLOPs and simulated seconds per round per profile (the
    keys it cannot compute left out)."""
    client, server = values.get(CLIENT_GFLOPS.key), values.get(SERVER_GFLOPS)
    mb = values.get(CLIENT_MB_EXCHANGED.key)
    out = {}
    if (total := total_gflops(client, server)) is not None:
        out[TOTAL] = total
    if client is not None and mb is not None:
        for name, profile in PROFILES.items():
            s = round_seconds(client, server or 0.0, mb, values.get("rounds"), profile)
            if s is not None:
                out[column(name)] = s
    return out
