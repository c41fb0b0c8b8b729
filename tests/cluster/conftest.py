"""The two-host testbed (testbed.py), opt-in: `DLSCALE_CLUSTER_TESTS=1`, or `make cluster-test`.
It needs root and network namespaces; where the machine forbids them each test is skipped with
the reason."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from tests.cluster.testbed import Testbed, why_not_here

BIN = Path(sys.executable).parent
OPT_IN = "DLSCALE_CLUSTER_TESTS"


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    reason = None
    if os.environ.get(OPT_IN) != "1":
        reason = f"the two-host testbed is opt-in: {OPT_IN}=1, or `make cluster-test`"
    else:
        reason = why_not_here()
    if reason:
        for item in items:
            if here in Path(item.fspath).parents:
                item.add_marker(pytest.mark.skip(reason=reason))


def same_weights(first: dict, second: dict) -> None:
    """The last checkpoints of two runs' records hold the same weights (to float rounding)."""
    a, b = (
        torch.load(Path(r["checkpoints"][-1]), weights_only=True)["model"] for r in (first, second)
    )
    for name, value in a.items():
        assert torch.allclose(b[name], value, rtol=1e-5, atol=1e-6), name


def clean_environment() -> dict:
    """This environment without a hand-set interface: what a user's fresh shell has."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_SOCKET_IFNAME")}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # set at all, it means "one machine"
    return env


@pytest.fixture(scope="module")
def hosts():
    """host-a (the Ray head), host-b and host-c, one CPU each: every process of a job of two or
    three lands on a host of its own."""
    with Testbed(hosts=3, cpus_per_host=1) as bed:
        bed.start_ray(str(BIN / "ray"), env=clean_environment())
        yield bed
    assert not bed.leftovers()
