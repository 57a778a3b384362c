"""MpFedcon's gradient-leakage study (§4.4, §5.10; spec methods/mpfedcon.md §5) as a method of
its own: DLG / iDLG attack one image's gradients on iDLG's randomly initialised LeNet, with every
gradient shared (FedAvg), with the last FC layers kept by the party (MpFedcon's local head:
cl / at) and with Gaussian / Laplace noise on the shared gradients (Tab. 4). Its ``attack`` step
evaluates itself (metrics, MSE curves, a picture of the reconstructions)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from fedssl.methods.base import DATA, Hook, Method, MethodParams, Step
from fedssl.methods.registry import register
from fedssl.params import Name, NoiseParams, Strict


class AttackSetting(Strict):
    """One column of Fig. 10 / Tab. 4: ``hidden_fc`` (cl) FC layers kept on the party,
    ``assumed_fc`` (at) FC layers the attacker guesses (None: the true layout), optional noise
    on the shared gradients."""

    label: Name = Field(description="names the setting's metrics (e.g. cl1_at2, g1e_2)")
    hidden_fc: NonNegativeInt = 0
    """cl: last FC layers the party keeps, their gradients unshared (0: none)"""
    assumed_fc: NonNegativeInt | None = None
    """at: how many FC layers the attacker guesses the party keeps (null: the true count)"""
    noise: NoiseParams | None = None

    @model_validator(mode="after")
    def _consistent(self):
        if self.hidden_fc == 0 and self.assumed_fc not in (None, 0):
            raise ValueError(
                f"{self.label}: with nothing hidden (cl=0) the attacker sees the "
                f"whole model; assumed_fc must be null or 0"
            )
        if self.hidden_fc > 0 and self.assumed_fc == 0:
            raise ValueError(
                f"{self.label}: with a hidden head the attacker must assume at "
                f"least one FC layer (assumed_fc >= 1)"
            )
        return self


class LeakageParams(MethodParams):
    """DLG / iDLG on iDLG's randomly initialised sigmoid LeNet (spec §5), one image at a time:
    label hit rates of the iDLG rule and of DLG on ``label_images`` images, and L-BFGS
    reconstructions (MSE curve per iteration, final image) of ``recon_images`` images."""

    name: Literal["gradient_leakage"] = "gradient_leakage"
    attacks: tuple[Literal["dlg", "idlg"], ...] = ("dlg", "idlg")
    """attacks run on every image: DLG (label optimised) and iDLG (label inferred)"""
    settings: tuple[AttackSetting, ...] = Field(min_length=1)
    """the settings attacked, one column of the results each (at least one)"""
    fc_hidden: tuple[PositiveInt, ...] = Field(
        (),
        description="widths of the LeNet's hidden FC layers before the classifier (the "
        "'cl' study needs cl - 1 of them)",
    )
    init_range: PositiveFloat = Field(0.5, description="LeNet weights ~ U(-r, r) (iDLG)")
    image_size: PositiveInt | None = Field(
        None, description="resize the images to this side (iDLG: 32 on CIFAR); None = as stored"
    )
    label_images: PositiveInt = Field(100, description="images for the label hit rate")
    recon_images: NonNegativeInt = Field(2, description="images reconstructed by L-BFGS")
    recon_label_images: NonNegativeInt = Field(
        10, description="images DLG's label is read from (a short L-BFGS run each)"
    )
    iterations: PositiveInt = Field(300, description="L-BFGS steps (lr 1) per reconstruction")
    lbfgs_max_iter: PositiveInt = 20
    """L-BFGS inner iterations per step (torch's max_iter)"""
    dlg_label_iterations: PositiveInt = Field(20, description="L-BFGS steps of the DLG label runs")
    success_mse: PositiveFloat = Field(
        1e-3, description="a reconstruction with a final MSE below this counts as recovered"
    )

    @model_validator(mode="after")
    def _layers(self):
        fcs = len(self.fc_hidden) + 1
        for s in self.settings:
            if s.hidden_fc > fcs:
                raise ValueError(
                    f"settings: {s.label}: hidden_fc={s.hidden_fc} but the LeNet "
                    f"has {fcs} FC layers (fc_hidden: {list(self.fc_hidden)})"
                )
        labels = [s.label for s in self.settings]
        if len(set(labels)) != len(labels):
            raise ValueError(f"settings: labels must be unique, got {labels}")
        return self


@register
class GradientLeakage(Method):
    name = "gradient_leakage"
    label = "Gradient leakage"
    params = LeakageParams
    steps = (
        Step(
            "attack",
            reads=("method",),
            inputs=(DATA,),
            gpu=False,
            metrics=("metrics.json",),
            plots=("mse_curves.tsv", "reconstructions.png"),
            runner=Hook("fedssl.methods.gradient_leakage.run", "attack"),
        ),
    )
    evaluation_sections = ()
    report_tables = Hook("fedssl.methods.gradient_leakage.tables", "leakage_tables")

    def arch(self, params) -> str:
        return "lenet" + "".join(f"-fc{w}" for w in params.fc_hidden)
