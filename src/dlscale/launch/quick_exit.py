"""Importing this module makes the process skip Python's last garbage collection at its exit.

At exit Python runs the atexit handlers, tears the modules down, and collects every object
still alive. With torch, scikit-learn and torch._dynamo imported, that collection alone takes
0.9-1.3 s of a core on the 2-core development machine, after the work is done: a shell's
prompt, and a caller reading the process's pipes (which the workers' fork server holds too),
wait for it. Frozen first (gc.freeze), those objects are left to the OS; atexit handlers,
buffered output and module teardown run as before. Python never promised to finalize objects
that are still alive at exit.

Only processes dlscale owns import it: the `dlscale` command (api.exit_quickly) and the workers'
fork server (launch/start.py preloads it; the workers forked from it end with os._exit, which
runs no atexit handler). A program that uses dlscale as a library keeps Python's usual exit.
"""

from __future__ import annotations

import atexit
import gc

atexit.register(gc.freeze)
