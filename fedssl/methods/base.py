"""What a method plugin declares, and the hooks the generic stages call.

A method is one module (or package) under :mod:`fedssl.methods` that defines a
:class:`Method` subclass and decorates it with :func:`fedssl.methods.registry.register`. It owns:

* ``params``: its member of the experiment's ``method`` union (only the fields it reads);
* ``steps``: the stages it adds to each of its experiments (what each reads and which function
  runs it); a method whose stages depend on its params (one per growth stage of a layer-wise
  schedule) overrides :meth:`Method.steps_for` (and ``encoder_inputs_for`` /
  ``costs_inputs_for``) instead;
* the hooks the shared stages call: the frozen encoder for the probes, the client costs and
  their projection, the report's tables and figures, and its ``row_label`` / ``arch``.

Code that does the work is named, not imported: a step's ``runner`` and the hooks are
``"module:function"`` references (:func:`call_hook` imports them when a stage runs). So the
declaration stays light (no torch: the front ends import every method's declaration to validate
params and build the DAG), and each stage depends only on the code it runs: a method's report
tables are not in its training's code, nor its cost formulas. A reference is checked when its
plugin registers (:func:`check_hooks`, at import, without importing the code): its module's
source must define the name, so a typo or a renamed function fails at once, naming the
plugin's attribute, not when a stage reaches it hours later.

A federated method names one reference for its training, ``recipe``: a function of its params
returning a typed :class:`fedssl.rounds.recipe.Recipe` (model, views, loss, strategy, ...),
which the one runtime builds and runs. One reference rather than one per part keeps the
declaration free of torch and the training's code dependencies exactly the recipe module's
imports (followed by :mod:`fedssl.codegraph`), while everything past it is typed Python.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from fedssl.params import Strict
from fedssl.stage.contract import DATA, PARTITION, StepContext

__all__ = [
    "DATA",
    "PARTITION",
    "FederatedMethod",
    "Method",
    "SupervisedFederatedMethod",
    "MethodParams",
    "Step",
    "StepContext",
    "call_hook",
]


def hook_module(hook: str) -> str:
    """The module of a ``"module:function"`` hook (its code is a dependency of the stage that
    calls it)."""
    return hook.partition(":")[0]


def resolve_hook(hook: str):
    """The function a ``"module:function"`` hook names (its module imported)."""
    module, _, function = hook.partition(":")
    return getattr(importlib.import_module(module), function)


def call_hook(hook: str, *args):
    """Import the function a ``"module:function"`` hook names and call it."""
    return resolve_hook(hook)(*args)


ROOT = Path(__file__).resolve().parents[2]  # the project's root, where module paths start


@cache
def defined_names(module: str) -> frozenset[str] | None:
    """The names a project module defines at its top level (functions, classes, assignments,
    imports), read from its source without importing it; None: no such module file."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            break
    else:
        return None
    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return frozenset(names)


def check_hook(hook: str, where: str) -> None:
    """Fail unless ``hook`` is a ``"module:function"`` whose module defines the function."""
    module, sep, name = hook.partition(":")
    names = defined_names(module) if sep and name else None
    if names is None:
        raise TypeError(f"{where} = {hook!r}: expected 'module:function' of a project module")
    if name not in names:
        raise TypeError(f"{where} = {hook!r}: module {module} defines no {name!r}")


HOOKS = (  # the class attributes that name code (besides the steps' runners)
    *("recipe", "encoder_builder", "encoder_hook", "client_costs_hook"),
    *("projected_costs_hook", "report_tables", "report_figures", "encoder_loader"),
    *("network", "loss", "step_loss", "encoder_of", "wrapper", "strategy", "describe"),
)


def check_hooks(cls: type[Method]) -> None:
    """Check every reference a plugin declares (its steps', its hooks', its Flower steps')."""
    named = {f"{cls.__name__}.{a}": getattr(cls, a, None) for a in HOOKS}
    named.update({f"{cls.__name__}.steps[{s.name}]": s.runner for s in cls.steps})
    named.update({f"{cls.__name__}.flower_steps[{k}]": h for k, h in cls.flower_steps.items()})
    for where, hook in named.items():
        if hook is not None:
            check_hook(hook, where)


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
    method that evaluates itself (``evaluation_sections = ()``, e.g. an attack study).
    ``runner``: the ``"module:function"`` that runs it, called with the stage context and then
    ``args``; the stage depends on that module's code only (None: the method's own
    ``<name>(ctx)``, for code that lives in the declaration itself)."""

    name: str
    reads: tuple[str, ...]
    inputs: tuple[str, ...] = (DATA, PARTITION)
    gpu: bool = True
    plots: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    runner: str | None = None
    args: tuple[Any, ...] = ()


class Method:
    """Base class of the method plugins; subclasses set the class attributes and hooks."""

    name: ClassVar[str]
    label: ClassVar[str]  # the report's row label
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
    # The hooks, as "module:function" (see the module doc). The frozen encoder: function(ctx)
    # -> nn.Module.
    encoder_hook: ClassVar[str | None] = None
    # Client costs (a `costs` stage) when set: the steps whose outputs the costs read, and
    # function(ctx) -> per-client rows; the projection at full scale: function(exp, partition,
    # dataset) -> the average client's costs (for `fedssl costs`).
    costs_inputs: ClassVar[tuple[str, ...] | None] = None
    costs_reads: ClassVar[tuple[str, ...]] = ("method", "partition")
    client_costs_hook: ClassVar[str | None] = None
    projected_costs_hook: ClassVar[str | None] = None
    # Report tables in the paper's layout: function(rows) -> {name: Markdown}; figures:
    # function(rows, out_dir) -> {file: caption}.
    report_tables: ClassVar[str | None] = None
    report_figures: ClassVar[str | None] = None
    # Per-client numbers of `client_costs` besides Tab. 3's that the report averages (columns
    # named without the `mean_` prefix).
    cost_columns: ClassVar[tuple[str, ...]] = ()
    # Steps that can run as a Flower app (`python -m stages.flower STEP EXPERIMENT`, see
    # fedssl.flower): step -> "module:function" building (model, its Federation) from the stage
    # context, the federation the step's runner drives and each Flower client trains.
    flower_steps: ClassVar[dict[str, str]] = {}

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
        Each row's ``step_results`` (:class:`fedssl.plan.layout.ReportRow`) says where its
        steps wrote their committed results. By default the function ``report_tables`` names."""
        return call_hook(self.report_tables, rows) if self.report_tables else {}

    def figures(self, rows: list[dict], out_dir) -> dict[str, str]:
        """Extra report figures drawn from the same rows into ``out_dir`` (the pipeline's
        committed report folder): file name -> caption. By default ``report_figures``'."""
        return call_hook(self.report_figures, rows, out_dir) if self.report_figures else {}

    def hooks(self, params: MethodParams, kind: str) -> list[str]:
        """The ``"module:function"`` hooks a stage of kind ``kind`` (a step, or a shared stage
        that calls a hook) calls of this method (its plan record names them)."""
        hooks = {
            "features": [self.encoder_hook],
            "finetune": [self.encoder_hook],
            "costs": [self.client_costs_hook],
            "report": [self.report_tables, self.report_figures],
        }.get(kind)
        if hooks is None:
            hooks = [s.runner for s in self.steps_for(params) if s.name == kind]
        return [h for h in hooks if h]

    def hook_modules(self, params: MethodParams, kind: str) -> list[str]:
        """The modules of :meth:`hooks`, which a stage of kind ``kind`` runs of this method
        besides its declaration: the stage's code dependencies."""
        return [hook_module(h) for h in self.hooks(params, kind)]

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

    def run_step(self, step: str, ctx: StepContext) -> None:
        """Run step ``step`` (a name in ``steps_for``): its ``runner``, or ``self.<step>(ctx)``."""
        declared = {s.name: s for s in self.steps_for(ctx.exp.method)}
        if step not in declared:
            raise KeyError(
                f"method '{self.name}' has no step '{step}' (its steps: {', '.join(declared)})"
            )
        s = declared[step]
        if s.runner:
            call_hook(s.runner, ctx, *s.args)
        else:
            getattr(self, step)(ctx)

    def encoder(self, ctx: StepContext):
        """The frozen encoder the probes read (an ``nn.Module`` mapping float images in [0, 1]
        to features), built from the outputs of ``encoder_inputs``: ``encoder_hook``'s."""
        if self.encoder_hook is None:
            raise NotImplementedError(f"method '{self.name}' has no frozen encoder for the probes")
        return call_hook(self.encoder_hook, ctx)

    def client_costs(self, ctx: StepContext) -> list[dict]:
        """Per-client costs (rows of :func:`fedssl.costs.summarize_client_costs`' input)."""
        if self.client_costs_hook is None:
            raise NotImplementedError(f"method '{self.name}' declares no client costs")
        return call_hook(self.client_costs_hook, ctx)

    def projected_costs(self, exp, partition, dataset: str) -> dict:
        """The average client's costs at full scale without data or training (for
        ``fedssl costs``)."""
        if self.projected_costs_hook is None:
            raise NotImplementedError(f"method '{self.name}' has no cost projection")
        return call_hook(self.projected_costs_hook, exp, partition, dataset)


class PretrainStepMethod(Method):
    """A method whose training is one federated step, ``pretrain`` (it reads the partition and
    every method param, and logs ``rounds.tsv``), whose probes read the encoder that step
    trained, and whose client costs are counted from that step's outputs.

    A subclass declares what is its own (``name``, ``label``, ``params``, ``encoder_builder``)
    and the ``package`` that holds its code, laid out by convention: ``run.py`` has
    ``pretrain(ctx)`` and ``encoder(ctx)``, ``costs.py`` has ``client_costs(ctx)`` and
    ``projected_costs(exp, partition, dataset)``; the step and the hooks name those. A method
    whose costs the library counts names that module instead (``costs_module``); one with steps
    after training declares them (``later_steps``)."""

    package: ClassVar[str]
    costs_module: ClassVar[str | None] = None  # default: the package's ``costs``
    # what the pretrain step reads and plots where that is less than every method param (a
    # param only a later step reads must not rerun training) or more than the round log
    pretrain_reads: ClassVar[tuple[str, ...]] = ("partition", "method")
    pretrain_plots: ClassVar[tuple[str, ...]] = ("rounds.tsv",)
    later_steps: ClassVar[tuple[Step, ...]] = ()  # steps after pretrain (MocoSFL's attack)
    encoder_inputs = ("pretrain",)
    encoder_reads = ("method.model",)
    costs_inputs = ("pretrain",)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        package = getattr(cls, "package", None)
        if package is None:  # a base of several plugins that do not say it yet
            return
        pretrain = Step(
            "pretrain",
            reads=cls.pretrain_reads,
            plots=cls.pretrain_plots,
            runner=f"{package}.run:pretrain",
        )
        cls.steps = (pretrain, *cls.later_steps)
        cls.encoder_hook = f"{package}.run:encoder"
        costs = cls.costs_module or f"{package}.costs"
        cls.client_costs_hook = f"{costs}:client_costs"
        cls.projected_costs_hook = f"{costs}:projected_costs"

    def arch(self, params: MethodParams) -> str:
        return params.model.arch


RUNTIME = "fedssl.methods.federated"  # the code that runs every FederatedMethod


class FederatedMethod(PretrainStepMethod):
    """A federated self-supervised method on the one runtime: its ``recipe`` (a
    ``"module:function"`` of its params returning a :class:`fedssl.rounds.recipe.Recipe`: the
    seeded model, the clients' views and loss, the strategy, an after-step hook, what is
    saved) is all it declares about training.

    :mod:`fedssl.methods.federated` runs it: model -> federation (the one builder, which
    applies the precision policy and the strategy's local objective) resumed from its
    checkpoint; then the model is saved and the probes get its encoder (``encoder_loader``;
    the Flower adapter builds the same federation). A subclass declares its params (a
    :func:`fedssl.params.federation_block` block with ``augment``, and ``strategy`` unless it
    names its own); its client costs are its package's ``costs`` module. FedSimCLR is the
    smallest example, FeatARC and Orchestra (their own views, forward, strategy, setup round)
    the largest."""

    recipe: ClassVar[str]  # "module:function": (params) -> Recipe
    encoder_loader: ClassVar[str] = f"{RUNTIME}:contrastive_encoder"  # (stage context)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if getattr(cls, "package", None) is None:
            return
        cls.steps = (replace(cls.steps[0], runner=f"{RUNTIME}:pretrain"), *cls.steps[1:])
        cls.encoder_hook = cls.encoder_loader
        if "flower_steps" not in vars(cls):  # one that declares its own ({}: none) keeps them
            cls.flower_steps = {"pretrain": f"{RUNTIME}:federation"}

    def hook_modules(self, params, kind: str) -> list[str]:
        """Training runs the runtime and the recipe's module (and what that imports)."""
        if kind != "pretrain":
            return super().hook_modules(params, kind)
        return [RUNTIME, hook_module(self.recipe)]


SUPERVISED_RUNTIME = "fedssl.methods.federated_supervised"  # runs every SupervisedFederatedMethod


class SupervisedFederatedMethod(Method):
    """A FedAvg-style supervised method: a labelled network and a loss. Every client trains the
    network (or the ``wrapper`` module holding it as ``net`` beside what its loss reads, such as
    MOON's reference copies) on its labelled images by the loss of its outputs; the strategy
    combines them and scores the global network on the test split after every round.

    :mod:`fedssl.methods.federated_supervised` runs its one step, ``train``: the seeded network,
    the cohort trainer, the strategy, the federation resumed from its checkpoint; then the
    network is saved with its classes (``model.pt``) and its test accuracy written
    (``global.json``); the probes get the encoder ``encoder_of`` takes from the saved network.
    A subclass declares its params (a federation block with ``augment`` and ``crop_padding``),
    its ``package`` (its client costs are that package's ``costs:client_costs``), and the
    hooks below, all ``"module:function"`` strings (see :class:`FederatedMethod`)."""

    network: ClassVar[str]  # (params, image shape, classes) -> the network, untrained
    loss: ClassVar[str]  # (outputs in fp32, batch, params) -> scalar
    step_loss: ClassVar[str | None] = None  # a whole-step loss instead (see FederatedMethod)
    encoder_of: ClassVar[str]  # (network, projection) -> the frozen encoder for the probes
    wrapper: ClassVar[str | None] = None  # (params, network) -> the module the clients train
    # (config, params, model, data, tests) -> the Strategy; default: FedAvg of the whole network
    strategy: ClassVar[str] = f"{SUPERVISED_RUNTIME}:ScoredFedAvg"
    describe: ClassVar[str | None] = None  # (federation, params) -> run-record facts
    package: ClassVar[str]
    encoder_inputs = ("train",)
    encoder_reads = ("method.model",)
    costs_inputs = ("train",)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        package = getattr(cls, "package", None)
        if package is None:
            return
        cls.steps = (
            Step(
                "train",
                reads=("partition", "method"),
                plots=("rounds.tsv",),
                metrics=("global.json",),
                runner=f"{SUPERVISED_RUNTIME}:train",
            ),
        )
        cls.encoder_hook = f"{SUPERVISED_RUNTIME}:encoder"
        cls.encoder_builder = f"{SUPERVISED_RUNTIME}:untrained_encoder"
        cls.client_costs_hook = f"{package}.costs:client_costs"

    def arch(self, params: MethodParams) -> str:
        return params.model.arch

    def hook_modules(self, params, kind: str) -> list[str]:
        """Training, and the probes' encoder, run the runtime and the hooks it calls."""
        hooks = {
            "train": (
                *(self.network, self.loss, self.step_loss, self.wrapper),
                *(self.strategy, self.describe),
            ),
            "features": (self.network, self.encoder_of),
            "finetune": (self.network, self.encoder_of),
        }.get(kind)
        if hooks is None:
            return super().hook_modules(params, kind)
        return [SUPERVISED_RUNTIME] + sorted(
            {hook_module(h) for h in hooks if h} - {SUPERVISED_RUNTIME}
        )
