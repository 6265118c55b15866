"""tools/fusion_probe.py's points: fusion fields and numbers only, each refusal naming the pair
(a point typed on a command line is parsed, never evaluated)."""

from __future__ import annotations

import dataclasses

import pytest

from spice_ray.config import FusionConfig
from tools.fusion_probe import parse_point

FIELDS = {f.name for f in dataclasses.fields(FusionConfig)}


def test_a_point_is_fixed_beta_fields_and_floats() -> None:
    assert parse_point("beta=4,tau=1,noise_var=1e6", FIELDS) == {
        "beta_schedule": "fixed", "beta": 4.0, "tau": 1.0, "noise_var": 1e6}
    assert parse_point("beta_schedule=sqrt2logt", FIELDS) == {"beta_schedule": "sqrt2logt"}
    assert parse_point("rule=greedy,beta=0", FIELDS) == {"beta_schedule": "fixed",
                                                          "rule": "greedy", "beta": 0.0}
    assert parse_point("td_n=1,gamma=0", FIELDS) == {"beta_schedule": "fixed", "td_n": 1,
                                                      "gamma": 0.0}
    assert isinstance(parse_point("td_n=2", FIELDS)["td_n"], int)
    assert parse_point("kernel=rbf,kernel_space=state,tau=0.1", FIELDS) == {
        "beta_schedule": "fixed", "kernel": "rbf", "kernel_space": "state", "tau": 0.1}


@pytest.mark.parametrize(("text", "named"), [
    ("beta", "'beta' is not field=value"),
    ("betta=1", "'betta=1' is not field=value"),
    ("tau=__import__('os')", "tau=\"__import__('os')\" is not a number"),
    ("rule=__import__('os')", "rule=\"__import__('os')\" is not one of greedy, ucb, thompson"),
    ("td_n=1.5", "td_n='1.5' is not an integer"),
    ("kernel_space=raw", "kernel_space='raw' is not one of latent, context, state"),
])
def test_a_bad_point_is_refused_naming_its_pair(text, named) -> None:
    with pytest.raises(ValueError, match="--point") as err:
        parse_point(text, FIELDS)
    assert named in str(err.value)
