"""Every registered strategy has a spec section that answers every fact the rest of dlscale asks
of it (processes, replicas, stages, how `scale` and `compare` grow it, ...), checked against
hand-computed values: a new strategy is enumerated here from the registry, and cannot skip it."""

from typing import Literal, get_args

import pytest
from pydantic import TypeAdapter

from dlscale.jobspec import STRATEGY_KINDS, StrategySection, StrategySpec
from dlscale.jobspec.training import OptimizerSpec
from dlscale.strategies import CHECKS, STRATEGIES

SECTION = TypeAdapter(StrategySpec)
COUNTS = ("processes", "trainers", "replicas", "model_states", "stages")

# One section of each strategy, not at its defaults, with its facts worked out by hand:
# processes, trainers, replicas, model_states, stages, in_process.
BY_HAND = [
    ({"name": "single"}, (1, 1, 1, 1, 1, True)),
    ({"name": "ddp", "workers": 3}, (3, 3, 3, 3, 1, False)),
    # 3 workers + 2 servers; the servers train nothing and hold one model state between them.
    ({"name": "ps", "workers": 3, "servers": 2}, (5, 3, 3, 4, 1, False)),
    # One replica's 3 stages share one model state.
    ({"name": "pipeline", "stages": 3}, (3, 3, 1, 1, 3, False)),
    ({"name": "hybrid", "stages": 2, "data_parallel": 3}, (6, 6, 3, 3, 2, False)),
    # Every process of a 2 × 3 mesh builds the whole model before its layers are split.
    ({"name": "tensor", "degree": 2, "data_parallel": 3}, (6, 6, 3, 6, 1, False)),
]


def name_of(kind: type[StrategySection]) -> str:
    return get_args(kind.model_fields["name"].annotation)[0]


def test_the_registry_and_the_spec_union_name_the_same_strategies():
    assert [name_of(kind) for kind in STRATEGY_KINDS] == list(STRATEGIES)
    assert set(CHECKS) <= set(STRATEGIES)
    for kind in STRATEGY_KINDS:
        assert type(SECTION.validate_python({"name": name_of(kind)})) is kind


def test_the_facts_by_hand_cover_every_registered_strategy():
    assert [settings["name"] for settings, _ in BY_HAND] == list(STRATEGIES)


@pytest.mark.parametrize(("settings", "facts"), BY_HAND, ids=[s["name"] for s, _ in BY_HAND])
def test_each_strategys_facts_match_the_hand_computed_ones(settings: dict, facts: tuple):
    section = SECTION.validate_python(settings)
    assert tuple(getattr(section, name) for name in (*COUNTS, "in_process")) == facts


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_registered_strategy_answers_every_fact(name: str):
    section = SECTION.validate_python({"name": name})
    assert isinstance(section, StrategySection)
    counts = {fact: getattr(section, fact) for fact in COUNTS}
    assert all(isinstance(n, int) and n >= 1 for n in counts.values()), counts
    assert section.replicas <= section.trainers <= section.processes
    assert isinstance(section.in_process, bool)
    assert section.processes == 1 or not section.in_process
    # `scale` and `compare` run it at a worker count: that many processes train (one in this
    # process for a strategy that runs in it), as their tables' `workers` column says.
    assert section.scaled(3).trainers == 3 and isinstance(section.scaled(3), StrategySection)
    for workers in (2, 4):
        for variant in type(section).variants().values():
            compared = SECTION.validate_python(variant.compared(workers, section, 8))
            assert compared.name == name
            assert compared.trainers == (1 if section.in_process else workers)
    optimizers = get_args(OptimizerSpec.model_fields["name"].annotation)
    assert all(isinstance(section.warnings(opt), list) for opt in optimizers)
    for precision in ("fp32", "bf16", "fp16"):
        try:
            section.check_precision(precision)
        except ValueError as refused:
            assert str(refused) and precision != "fp32"  # every strategy trains in fp32


def test_compare_names_each_variant_once():
    names = [name for kind in STRATEGY_KINDS for name in kind.variants()]
    assert len(names) == len(set(names))


def test_a_section_that_forgets_a_count_cannot_be_made():
    class Forgetful(StrategySection):
        name: Literal["forgetful"] = "forgetful"

        @property
        def processes(self) -> int:
            return 1

    with pytest.raises(TypeError, match="compared, replicas"):
        Forgetful()
