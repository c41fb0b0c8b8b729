"""What the workers' fork server imports (launch/start.py `context`): every module of PRELOAD,
with Ctrl-C ignored while it does (`import_quietly`). From then on the server's own loop ignores
SIGINT (multiprocessing.forkserver.main), and the workers it forks get back the handler that was
in place before, restored once the imports are done."""

from dlscale.launch.start import PRELOAD, import_quietly

import_quietly(PRELOAD)
