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
:class:`~fedssl.methods.hooks.Hook` references (module and attribute; :func:`call_hook` imports
them when a stage runs), each field typed by the protocol its hook must satisfy. So the
declaration stays light (no torch: the front ends import every method's declaration to validate
params and build the DAG), and each stage depends only on the code it runs: a method's report
tables are not in its training's code, nor its cost formulas. A hook is checked when its
plugin registers (:func:`check_hooks`, at import, without importing the code): its module's
source must define the name and take the arguments the field's protocol passes, so a typo, a
renamed function or a wrong signature fails at once, naming the plugin's field, not when a
stage reaches it hours later.

A federated method names one hook for its training, ``recipe``: a function of its params
returning a typed :class:`fedssl.rounds.recipe.Recipe` (model, views, loss, strategy, ...),
which the one runtime builds and runs. One hook rather than one per part keeps the
declaration free of torch and the training's code dependencies exactly the recipe module's
imports (followed by :mod:`fedssl.codegraph`), while everything past it is typed Python.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from pydantic import model_validator

from fedssl.methods.hooks import (
    ClientCosts,
    Describe,
    EncoderBuilder,
    EncoderLoader,
    EncoderOf,
    FlowerFederation,
    Hook,
    NetworkOf,
    OutputsLoss,
    ProjectedCosts,
    RecipeOf,
    ReportFigures,
    ReportTables,
    StepLossOf,
    StepRunner,
    StrategyOf,
    WrapperOf,
    call_hook,
    check_hook,
    hook_fields,
    hook_module,
)
from fedssl.params import Strict, federation_path
from fedssl.stage.contract import DATA, PARTITION, StepContext

__all__ = [
    "DATA",
    "PARTITION",
    "FederatedMethod",
    "Hook",
    "Method",
    "SupervisedFederatedMethod",
    "MethodParams",
    "Step",
    "StepContext",
    "call_hook",
]


def check_hooks(cls: type[Method]) -> None:
    """Check every hook a plugin declares (its typed fields', its steps' runners, its Flower
    steps') against the protocol its field names (:func:`fedssl.methods.hooks.check_hook`)."""
    where = f"method '{cls.name}': {cls.__name__}"
    fields = hook_fields(cls)
    for name in dir(cls):
        if isinstance(getattr(cls, name), Hook) and name not in fields:
            raise TypeError(f"{where}.{name}: a Hook in a field no base types as Hook[protocol]")
    for field, spec in fields.items():
        ref = getattr(cls, field, None)
        if ref is not None:
            check_hook(f"{where}.{field}", ref, spec)
    for s in cls.steps:
        if s.runner is not None:
            check_hook(f"{where}.steps[{s.name}].runner", s.runner, StepRunner, len(s.args))
    for step, ref in cls.flower_steps.items():
        check_hook(f"{where}.flower_steps[{step}]", ref, FlowerFederation)


class MethodParams(Strict):
    """Base of a method's params section; each method narrows ``name`` to its own Literal.
    A federated method keeps its federation settings in one block (a
    :func:`fedssl.strategies.choices.federation_block`) at ``method.federation``, or a
    multi-phase method at ``method.phases.<name>.federation``."""

    name: str
    seed: int = 0
    """root of the method's random draws: weights, client sampling, batch order, views"""
    # the name the federation block had before it moved (a file still using it is told)
    federation_was: ClassVar[str | None] = None

    def check_sections(self, experiment) -> None:
        """Refuse (ValueError, naming the fields) settings of the experiment's other
        sections that this method's params cannot serve; none by default."""

    @model_validator(mode="before")
    @classmethod
    def _federation_settings_in_their_block(cls, data):
        """A federation setting at the method's top level, or the block under its old name
        (where files wrote them before the one federation block), is named with its new
        path, before any compute."""
        path = federation_path(cls)
        if path is None or not isinstance(data, dict):
            return data
        if cls.federation_was in data:
            raise ValueError(
                f"{cls.federation_was}: renamed; write {path} (the method's one federation "
                f"block, with the same settings)"
            )
        field = cls.model_fields.get("federation")
        if field is None:
            return data
        moved = [
            k for k in data if k in field.annotation.model_fields and k not in cls.model_fields
        ]
        if moved:
            paths = ", ".join(f"method.federation.{k}" for k in moved)
            raise ValueError(
                f"{', '.join(moved)}: moved into the federation block; write {paths} "
                f"(method: {{federation: {{{moved[0]}: ...}}}})"
            )
        return data


@dataclass(frozen=True)
class Step:
    """A stage a method adds to each of its experiments (``<name>__<experiment>``).

    ``reads``: the experiment params it reads, as dotted keys (``method.phases.phase1``,
    ``partition``); both front ends rerun it when one of them changes, and only then.
    ``inputs``: ``data``, ``partition`` and/or earlier steps of the same method whose outputs it
    reads. ``plots``:
    per-round or per-epoch logs it writes (TSV, committed under ``results/``). ``metrics``:
    metric files it writes there (JSON, DVC metrics; the report reads the first one), for a
    method that evaluates itself (``evaluation_sections = ()``, e.g. an attack study).
    ``runner``: the hook that runs it, called with the stage context and then
    ``args``; the stage depends on that module's code only (None: the method's own
    ``<name>(ctx)``, for code that lives in the declaration itself)."""

    name: str
    reads: tuple[str, ...]
    inputs: tuple[str, ...] = (DATA, PARTITION)
    gpu: bool = True
    plots: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    runner: Hook[StepRunner] | None = None
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
    # Taking the encoder away (fedssl.export): the hook building the untrained module
    # the ``encoder`` hook returns, from (method params, image shape, projection); the exported
    # weights load into it. None: the method's encoder cannot be exported.
    encoder_builder: ClassVar[Hook[EncoderBuilder] | None] = None
    # The hooks (see the module doc). The frozen encoder: function(ctx) -> nn.Module.
    encoder_hook: ClassVar[Hook[EncoderLoader] | None] = None
    # Client costs (a `costs` stage) when set: the steps whose outputs the costs read, and
    # function(ctx) -> per-client rows; the projection at full scale: function(exp, partition,
    # dataset) -> the average client's costs (for `fedssl costs`).
    costs_inputs: ClassVar[tuple[str, ...] | None] = None
    costs_reads: ClassVar[tuple[str, ...]] = ("method", "partition")
    client_costs_hook: ClassVar[Hook[ClientCosts] | None] = None
    projected_costs_hook: ClassVar[Hook[ProjectedCosts] | None] = None
    # Report tables in the paper's layout: function(rows) -> {name: Markdown}; figures:
    # function(rows, out_dir) -> {file: caption}.
    report_tables: ClassVar[Hook[ReportTables] | None] = None
    report_figures: ClassVar[Hook[ReportFigures] | None] = None
    # Per-client numbers of `client_costs` besides Tab. 3's that the report averages (columns
    # named without the `mean_` prefix).
    cost_columns: ClassVar[tuple[str, ...]] = ()
    # Steps that can run as a Flower app (`python -m stages.flower STEP EXPERIMENT`, see
    # fedssl.flower): step -> the hook building (model, its Federation) from the stage
    # context, the federation the step's runner drives and each Flower client trains.
    flower_steps: ClassVar[dict[str, Hook[FlowerFederation]]] = {}

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
        """The hooks (as ``"module:function"``) a stage of kind ``kind`` (a step, or a shared stage
        that calls a hook) calls of this method (its plan record names them)."""
        hooks = {
            "features": [self.encoder_hook],
            "finetune": [self.encoder_hook],
            "costs": [self.client_costs_hook],
            "report": [self.report_tables, self.report_figures],
        }.get(kind)
        if hooks is None:
            hooks = [s.runner for s in self.steps_for(params) if s.name == kind]
        return [str(h) for h in hooks if h]

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

    def round_steps(self, params: MethodParams) -> tuple[str, ...]:
        """The steps that run the federation's rounds: those that read its block."""
        path = federation_path(type(params))
        if path is None:
            return ()
        return tuple(
            s.name
            for s in self.steps_for(params)
            if any(path == r or path.startswith(r + ".") for r in s.reads)
        )

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
            runner=Hook(f"{package}.run", "pretrain"),
        )
        cls.steps = (pretrain, *cls.later_steps)
        cls.encoder_hook = Hook(f"{package}.run", "encoder")
        costs = cls.costs_module or f"{package}.costs"
        cls.client_costs_hook = Hook(costs, "client_costs")
        cls.projected_costs_hook = Hook(costs, "projected_costs")

    def arch(self, params: MethodParams) -> str:
        return params.model.arch


RUNTIME = "fedssl.methods.federated"  # the code that runs every FederatedMethod


class FederatedMethod(PretrainStepMethod):
    """A federated self-supervised method on the one runtime: its ``recipe`` (a
    hook, a function of its params returning a :class:`fedssl.rounds.recipe.Recipe`: the
    seeded model, the clients' views and loss, the strategy, an after-step hook, what is
    saved) is all it declares about training.

    :mod:`fedssl.methods.federated` runs it: model -> federation (the one builder, which
    applies the precision policy and the strategy's local objective) resumed from its
    checkpoint, logged by the recipe's monitor; then what the recipe saves and writes of the
    finished run, and the probes get its encoder (``encoder_loader``; the Flower adapter
    builds the same federation). A subclass declares its params (a
    :func:`fedssl.params.federation_block` block with ``augment``, and ``strategy`` unless it
    names its own); its client costs are its package's ``costs`` module. FedSimCLR is the
    smallest example, FeatARC and Orchestra (their own views, forward, strategy, setup round)
    larger ones, MocoSFL (a split trainer, its own monitor and two-part model, an attack
    step after training) the furthest from FedAvg."""

    recipe: ClassVar[Hook[RecipeOf]]
    encoder_loader: ClassVar[Hook[EncoderLoader]] = Hook(RUNTIME, "contrastive_encoder")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if getattr(cls, "package", None) is None:
            return
        cls.steps = (replace(cls.steps[0], runner=Hook(RUNTIME, "pretrain")), *cls.steps[1:])
        cls.encoder_hook = cls.encoder_loader
        if "flower_steps" not in vars(cls):  # one that declares its own ({}: none) keeps them
            cls.flower_steps = {"pretrain": Hook(RUNTIME, "federation")}

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
    hooks below (see :class:`FederatedMethod`)."""

    network: ClassVar[Hook[NetworkOf]]  # (params, image shape, classes) -> untrained network
    loss: ClassVar[Hook[OutputsLoss]]  # (outputs in fp32, batch, params) -> scalar
    step_loss: ClassVar[Hook[StepLossOf] | None] = None  # a whole-step loss instead
    encoder_of: ClassVar[Hook[EncoderOf]]  # (network, projection) -> the probes' encoder
    wrapper: ClassVar[Hook[WrapperOf] | None] = None  # (params, network) -> what clients train
    # (config, params, model, data, tests) -> the Strategy; default: FedAvg of the whole network
    strategy: ClassVar[Hook[StrategyOf]] = Hook(SUPERVISED_RUNTIME, "ScoredFedAvg")
    describe: ClassVar[Hook[Describe] | None] = None  # (federation, params) -> run facts
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
                runner=Hook(SUPERVISED_RUNTIME, "train"),
            ),
        )
        cls.encoder_hook = Hook(SUPERVISED_RUNTIME, "encoder")
        cls.encoder_builder = Hook(SUPERVISED_RUNTIME, "untrained_encoder")
        cls.client_costs_hook = Hook(f"{package}.costs", "client_costs")

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
