"""The `loglake` command line (loglake.cli.main)."""

from loglake.cli.early import guard_start_up

# First thing in the process, before the CLI's imports (most of a second): Ctrl-C during
# `loglake serve`'s start-up exits cleanly (loglake/cli/early.py).
guard_start_up()
