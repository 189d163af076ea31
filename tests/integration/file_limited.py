"""The real ``fleetwatch`` command, run under a lower limit on open files.

Run as ``python -m tests.integration.file_limited N ARGS...``: the soft ``RLIMIT_NOFILE`` is set
to ``N``, then ``fleetwatch ARGS...`` runs as it would from the command line. Nothing of it is
replaced; a test can then run the process out of files with connections alone.
"""

from __future__ import annotations

import resource
import sys

from cli.main import main

if __name__ == "__main__":
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard))
    raise SystemExit(main(sys.argv[2:]))
