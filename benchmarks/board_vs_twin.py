"""Each self-supervised line of the board against its untrained twin, seed by seed: the paired
difference (same seed, same starting network, same probe), its mean, 95 % interval (Student's
t) and unadjusted p. A line's twin is the line of 0 rounds on the same encoder and partition
(the random-init small CNN, MFCL's stem at init, the ViT or split ResNet at init). The
board's own test adjusts p over a partition's comparisons (Holm); this table gives the
interval of each difference on its own.

    python benchmarks/board_vs_twin.py board > results/runs/board_vs_twin.txt
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedssl.plan.recheck import SEEDED  # noqa: E402
from fedssl.reporting.report import trained_no_round  # noqa: E402
from fedssl.reporting.stats import compare, interval  # noqa: E402


def main(pipeline: str) -> None:
    rows = json.loads(Path(f"results/reports/{pipeline}/report.json").read_text())["rows"]
    runs = defaultdict(dict)  # (row, column) -> seed -> metrics
    twins = defaultdict(dict)  # (encoder, column) -> seed -> metrics
    for r in rows:
        if r.get("linear_top1") is None:
            continue  # a personalised line (FedAvg's too: its name is the encoder line's)
        seeded = SEEDED.fullmatch(r["experiment"])
        seed = int(seeded[2]) if seeded else 0
        if trained_no_round(r):  # its encoder's untrained twin
            twins[r["arch"], r["column"]][seed] = r
        else:
            runs[r["row"], r["arch"], r["column"]][seed] = r
    print(f"# {pipeline}: line minus its untrained twin, paired by seed (points)")
    print("line\tpartition\tmetric\tseeds\tdifferences\tmean\tci95_low\tci95_high\tp")
    for (row, arch, column), by_seed in runs.items():
        twin = twins.get((arch, column), {})
        seeds = sorted(s for s in by_seed if s in twin)
        if len(seeds) < 2:
            continue
        for metric in ("linear_top1", "knn_top1"):
            line = {s: float(by_seed[s][metric]) for s in seeds}
            ref = {s: float(twin[s][metric]) for s in seeds}
            d = [line[s] - ref[s] for s in seeds]
            low, high = interval(d)
            cells = [row, column, metric, len(d), " ".join(f"{x:+.2f}" for x in d)]
            cells += [f"{statistics.mean(d):+.2f}", f"{low:+.2f}", f"{high:+.2f}"]
            print("\t".join(map(str, cells)), f"{compare(line, ref).p:.3f}", sep="\t")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "board")
