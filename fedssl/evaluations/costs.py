"""Client costs, from the method's cost hook and the steps it reads (``stages/costs.py``)."""

from fedssl.evaluations import PARTITION, Evaluation, register

register(
    Evaluation(
        "costs",
        (),
        (PARTITION,),
        lambda method, exp: method.costs_inputs_for(exp.method) is not None,
        order=50,
        uses="costs",
    )
)
