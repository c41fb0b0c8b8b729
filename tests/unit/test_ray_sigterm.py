"""ray.init installs its own SIGTERM handler (`sys.exit(15)`); dlscale's commands take Ctrl-C's
path on SIGTERM (signals.py), so every ray.init of dlscale's leaves the handler it found. The
defect: `serve-model` SIGTERMed as soon as its model first answered exited 15, its handler not
yet set back."""

import signal
import sys
from pathlib import Path

import pytest

from dlscale.api import serving
from dlscale.api.serving import ServingOptions
from dlscale.launch.ray_cluster import init_keeping_sigterm

SRC = Path(__file__).resolve().parents[2] / "src" / "dlscale"


class FakeRay:
    """What ray.init does to a process's SIGTERM handler, and nothing else."""

    def __init__(self, fails: bool = False):
        self.fails, self.inits = fails, 0

    def init(self, **kwargs):
        self.inits += 1
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
        if self.fails:
            raise ConnectionError("no head")

    def is_initialized(self) -> bool:
        return False


def ours(signum, frame):  # the handler the command set before Ray started
    raise KeyboardInterrupt


def test_ray_init_leaves_the_sigterm_handler_it_found():
    before = signal.signal(signal.SIGTERM, ours)
    try:
        ray = FakeRay()
        assert serving._start_ray(ray, ServingOptions()) is True and ray.inits == 1
        assert signal.getsignal(signal.SIGTERM) is ours
        with pytest.raises(ConnectionError):
            init_keeping_sigterm(FakeRay(fails=True))
        assert signal.getsignal(signal.SIGTERM) is ours  # also when ray.init fails
    finally:
        signal.signal(signal.SIGTERM, before)


def test_no_other_ray_init_in_dlscale():
    calls = [
        path.relative_to(SRC).as_posix()
        for path in SRC.rglob("*.py")
        if "ray.init("
        in "".join(
            line
            for line in path.read_text().splitlines()
            if not line.lstrip().startswith(("#", '"', "("))
        )
    ]
    assert calls == ["launch/ray_cluster.py"], calls
