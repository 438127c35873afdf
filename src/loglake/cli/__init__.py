"""The `loglake` command line (typer). Entry point: `loglake.cli.main:main`."""
