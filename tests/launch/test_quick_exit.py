"""The `dlscale` command ends without Python's last garbage collection (launch/quick_exit.py),
keeping its exit code; the workers' fork server preloads the same (test_fork_preload.py)."""

import subprocess
import sys

from dlscale.launch import start

# Registered before the command's own handlers, so it runs after them: what the collector was
# left with when Python's teardown began.
PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0))
sys.argv = ["dlscale", "train", "no-such-spec.yaml"]
from dlscale.cli.main import main
main()
"""


def test_the_command_freezes_what_is_alive_before_python_collects_it():
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 2, result.stderr  # a user error's exit code survives
    assert "no-such-spec.yaml" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout.split() == ["frozen", "True"], result.stdout


def test_the_fork_server_preloads_it():
    assert "dlscale.launch.quick_exit" in start.PRELOAD
