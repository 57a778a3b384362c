"""What a method plugin declares, and the hooks the generic stages call.

A method is one module (or package) under :mod:`fedssl.methods` that defines a
:class:`Method` subclass and decorates it with :func:`fedssl.methods.registry.register`. It owns:

* ``params``: its member of the experiment's ``method`` union (only the fields it reads);
* ``steps``: the stages it adds to each of its experiments (what each reads and runs); a method
  whose stages depend on its params (one per growth stage of a layer-wise schedule) overrides
  :meth:`Method.steps_for` (and ``encoder_inputs_for`` / ``costs_inputs_for``) instead;
* the hooks the shared stages call: the frozen ``encoder`` for the probes, ``client_costs``,
  and the report's ``row_label`` / ``arch``.

This module is light (no torch): the front ends import every method's declaration to validate
params and build the DAG; the heavy code is imported inside the hooks, when a stage runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from fedssl.params import Strict

if TYPE_CHECKING:  # pragma: no cover
    from fedssl.stage import StageContext

DATA, PARTITION = "data", "partition"  # step inputs besides the outputs of earlier steps


class MethodParams(Strict):
    """Base of a method's params section; each method narrows ``name`` to its own Literal."""
    name: str
    seed: int = 0


@dataclass(frozen=True)
class Step:
    """A stage a method adds to each of its experiments (``<name>__<experiment>``).

    ``reads``: the experiment params it reads, as dotted keys (``method.phase1``, ``partition``);
    both front ends rerun it when one of them changes, and only then. ``inputs``: ``data``,
    ``partition`` and/or earlier steps of the same method whose outputs it reads. ``plots``:
    per-round or per-epoch logs it writes (TSV, committed under ``results/``). ``metrics``:
    metric files it writes there (JSON, DVC metrics; the report reads the first one), for a
    method that evaluates itself (``evaluation_sections = ()``, e.g. an attack study)."""
    name: str
    reads: tuple[str, ...]
    inputs: tuple[str, ...] = (DATA, PARTITION)
    gpu: bool = True
    plots: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()


class Method:
    """Base class of the method plugins; subclasses set the class attributes and hooks."""
    name: ClassVar[str]
    label: ClassVar[str]                       # the report's row label
    params: ClassVar[type[MethodParams]]
    steps: ClassVar[tuple[Step, ...]] = ()
    # Evaluation. By the shared probes (features, linear_probe, knn): the steps whose outputs
    # the frozen encoder is built from, and the method params that build it. Personalised
    # (personal): the steps that wrote a `personal.npz` (:class:`fedssl.eval.personal.
    # PersonalLog`), summarised by the shared `personal` stage.
    encoder_inputs: ClassVar[tuple[str, ...]] = ()
    encoder_reads: ClassVar[tuple[str, ...]] = ("method",)
    evaluation_sections: ClassVar[tuple[str, ...]] = ("features", "linear_probe", "knn")
    personal_inputs: ClassVar[tuple[str, ...]] = ()
    # Fine-tuning (an experiment's optional `finetune` section): the encoder hook's module can
    # be unfrozen and trained end to end.
    finetunable: ClassVar[bool] = False
    # Taking the encoder away (fedssl.export): "module:function" building the untrained module
    # the ``encoder`` hook returns, from (method params, image shape, projection); the exported
    # weights load into it. None: the method's encoder cannot be exported.
    encoder_builder: ClassVar[str | None] = None
    # Client costs (a `costs` stage) when set: the steps whose outputs the costs read.
    costs_inputs: ClassVar[tuple[str, ...] | None] = None
    costs_reads: ClassVar[tuple[str, ...]] = ("method", "partition")
    # Report tables in the paper's layout: "module:function" taking the report rows. Named by a
    # string so that the layout code is a dependency of the report only, not of the training
    # stages (whose code is everything the method's module imports).
    report_tables: ClassVar[str | None] = None
    # Per-client numbers of `client_costs` besides Tab. 3's that the report averages (columns
    # named without the `mean_` prefix).
    cost_columns: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------------ report
    def row_label(self, params: MethodParams) -> str:
        """The pivot's row for this method's experiments (e.g. MFCL(TN))."""
        return self.label

    def arch(self, params: MethodParams) -> str:
        return ""

    def tables(self, rows: list[dict]) -> dict[str, str]:
        """Extra report tables in the layout of the method's paper (name -> Markdown), from
        the pipeline's report rows (every metric of their metrics files; ``row["method"]``
        says whose they are: a paper's table may lay out several of its methods).
        By default the function ``report_tables`` names, if any."""
        if self.report_tables is None:
            return {}
        import importlib
        module, _, function = self.report_tables.partition(":")
        return getattr(importlib.import_module(module), function)(rows)

    def figures(self, rows: list[dict], out_dir) -> dict[str, str]:
        """Extra report figures drawn from the same rows into ``out_dir`` (the pipeline's
        committed report folder): file name -> caption."""
        return {}

    # ------------------------------------------------------------------ stages
    # The DAG's shape may depend on the method's params (LW-FedSSL: one cached stage per
    # growth stage, S of them). The front ends ask these hooks, not the class attributes.
    def steps_for(self, params: MethodParams) -> tuple[Step, ...]:
        """The steps of an experiment with these method params (default: ``steps``)."""
        return self.steps

    def encoder_inputs_for(self, params: MethodParams) -> tuple[str, ...]:
        """The steps the frozen encoder is built from (default: ``encoder_inputs``)."""
        return self.encoder_inputs

    def costs_inputs_for(self, params: MethodParams) -> tuple[str, ...] | None:
        """The steps the client costs read, or None for no costs stage (default:
        ``costs_inputs``)."""
        return self.costs_inputs

    def run_step(self, step: str, ctx: "StageContext") -> None:
        """Run step ``step`` (a name in ``steps_for``): calls ``self.<step>(ctx)``."""
        getattr(self, step)(ctx)

    def encoder(self, ctx: "StageContext"):
        """The frozen encoder the probes read (an ``nn.Module`` mapping float images in [0, 1]
        to features), built from the outputs of ``encoder_inputs``."""
        raise NotImplementedError(f"method '{self.name}' has no frozen encoder for the probes")

    def client_costs(self, ctx: "StageContext") -> list[dict]:
        """Per-client costs (rows of :func:`fedssl.costs.summarize_client_costs`' input)."""
        raise NotImplementedError(f"method '{self.name}' declares no client costs")

    def projected_costs(self, exp, partition, dataset: str) -> dict:
        """The average client's costs at full scale without data or training (for
        ``python -m fedssl.costs``)."""
        raise NotImplementedError(f"method '{self.name}' has no cost projection")
