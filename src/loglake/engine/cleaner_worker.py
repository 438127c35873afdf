"""`python -m loglake.engine.cleaner_worker PARENT_PID`: a cleaner worker process (see
loglake.engine.cleaner_job). A module of its own so that the job classes keep their real module
name when pickled."""

import sys

from loglake.engine.cleaner_job import worker_main

if __name__ == "__main__":  # pragma: no cover - the worker process
    worker_main(sys.argv)
