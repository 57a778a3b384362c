"""``fedssl costs EXPERIMENT...``: each experiment's projected full-scale client costs, through
its method's ``projected_costs`` hook. A face above the method registry: the methods use the
meters of :mod:`fedssl.costs`; this command uses the methods."""

from __future__ import annotations

import argparse
import sys

from fedssl.costs import CLIENT_COSTS, table_format
from fedssl.methods import registry
from fedssl.params import ParamsError
from fedssl.presets import Presets


def main(argv: list[str] | None = None) -> int:
    """``fedssl costs EXPERIMENT...``: the average client's projected full-scale
    costs of each experiment preset, as a Markdown table (nothing is run or written)."""
    ap = argparse.ArgumentParser(prog="fedssl costs", description=main.__doc__)
    ap.add_argument("experiments", nargs="+", help="params/experiments/<name>.yaml presets")
    names = ap.parse_args(argv).experiments
    print(
        "| experiment | bits (paper's formula) | MB sent + received | FLOPs "
        "| memory MB (paper's formula) | step peak MB | other (method's own) |"
    )
    print("|---|---|---|---|---|---|---|")
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

        shown = {f"mean_{key}" for key in CLIENT_COSTS}
        other = ", ".join(
            f"{k.removeprefix('mean_')}={v:.4g}" for k, v in c.items() if k not in shown
        )
        print(
            f"| {name} | {cell('mean_paper_bits', table_format)} "
            f"| {cell('mean_bytes_exchanged', lambda v: f'{v / 1e6:.4g}')} "
            f"| {cell('mean_flops', table_format)} "
            f"| {cell('mean_paper_memory_bytes', lambda v: f'{v / 1e6:.3g}')} "
            f"| {cell('mean_peak_step_bytes', lambda v: f'{v / 1e6:.3g}')} | {other} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
