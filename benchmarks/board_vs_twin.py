"""Each self-supervised line of the board against its untrained twin, seed by seed: the paired
difference (same seed, same starting network, same probe), its mean, 95 % interval (Student's
t) and unadjusted p. The board's own test adjusts p over a partition's comparisons (Holm);
this table gives the interval of each difference on its own.

    python benchmarks/board_vs_twin.py board > results/runs/board_vs_twin.txt
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from scipy import stats

REFERENCE = "Random-init encoder (same network)"


def main(pipeline: str) -> None:
    rows = json.loads(Path(f"results/reports/{pipeline}/report.json").read_text())["rows"]
    runs = defaultdict(dict)  # (row, column) -> seed -> metrics
    for r in rows:
        seed = int(r["experiment"].rsplit("_s", 1)[1]) if "_s" in r["experiment"] else 0
        runs[r["row"], r["column"]][seed] = r
    print(f"# {pipeline}: line minus its untrained twin, paired by seed (points)")
    print("line\tpartition\tmetric\tseeds\tdifferences\tmean\tci95_low\tci95_high\tp")
    for (row, column), by_seed in runs.items():
        twin = runs.get((REFERENCE, column), {})
        seeds = sorted(s for s in by_seed if s in twin)
        if row == REFERENCE or len(seeds) < 2:
            continue
        for metric in ("linear_top1", "knn_top1"):
            d = [float(by_seed[s][metric]) - float(twin[s][metric]) for s in seeds]
            mean, half = statistics.mean(d), 0.0
            half = stats.t.ppf(0.975, len(d) - 1) * statistics.stdev(d) / len(d) ** 0.5
            p = stats.ttest_1samp(d, 0).pvalue
            cells = [row, column, metric, len(d), " ".join(f"{x:+.2f}" for x in d)]
            print(
                "\t".join(map(str, cells)),
                f"{mean:+.2f}\t{mean - half:+.2f}\t{mean + half:+.2f}\t{p:.3f}",
                sep="\t",
            )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "board")
