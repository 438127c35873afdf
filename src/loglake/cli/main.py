"""The `loglake` command line: topics, produce, consume, groups, configs, schemas, verify, inspect, demo.

topics, produce and consume work on a stopped data directory or, with --bootstrap-server, through
a running broker; groups and configs always talk to a broker.

Every operating error (a LoglakeError: unknown topic, bad config, locked or corrupt data
directory) and every CliError ends the command with one red line on stderr and exit code 1;
usage errors exit 2 (typer's default). `main()` is the console-script entry point.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import time
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.models import CommandInfo, TyperInfo

import loglake
from loglake.cli import interrupt
from loglake.cli.common import CliError, report_error
from loglake.cli.early import GLOBAL_OPTIONS
from loglake.errors import LoglakeError
from loglake.extras import missing_extra

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


#: Every subcommand: name -> (module, attribute, whether the attribute is a Typer of its own
#: subcommands), in the order `loglake --help` lists them. A command's module is imported when the
#: command runs (or --help lists it), not when `loglake` starts: `loglake groups describe` does not
#: pay for the broker's handler tables that `loglake topics` and `loglake serve` import (0.9 s of
#: CPU for every command before, on this machine).
SUBCOMMANDS: dict[str, tuple[str, str, bool]] = {
    "produce": ("loglake.cli.data", "produce", False),
    "consume": ("loglake.cli.data", "consume", False),
    "inspect": ("loglake.cli.inspect", "inspect", False),
    "serve": ("loglake.cli.serve", "serve", False),
    "verify": ("loglake.cli.verify", "verify", False),
    "demo": ("loglake.cli.demo", "demo", False),
    "topics": ("loglake.cli.topics", "app", True),
    "pipeline": ("loglake.cli.pipeline", "app", True),
    "groups": ("loglake.cli.groups", "app", True),
    "configs": ("loglake.cli.configs", "app", True),
    "users": ("loglake.cli.users", "app", True),
    "schemas": ("loglake.cli.schemas", "app", True),
}


def load_subcommand(name: str) -> TyperGroup | TyperCommand:
    """The click command of SUBCOMMANDS[name], built as `app.add_typer` / `app.command` would
    have built it (with the top-level app's help and exception settings)."""
    module, attribute, is_app = SUBCOMMANDS[name]
    target = getattr(importlib.import_module(module), attribute)
    if is_app:
        return typer.main.get_group_from_info(
            TyperInfo(target, name=name),
            pretty_exceptions_short=app.pretty_exceptions_short,
            suggest_commands=app.suggest_commands,
            rich_markup_mode=app.rich_markup_mode,
        )
    command = typer.main.get_command_from_info(
        CommandInfo(name=name, callback=target),
        pretty_exceptions_short=app.pretty_exceptions_short,
        rich_markup_mode=app.rich_markup_mode,
    )
    assert isinstance(command, TyperCommand)
    return command


class LoglakeGroup(TyperGroup):
    """Turns operating errors into one red line and exit code 1, for every subcommand, and
    imports a subcommand's module only when it is asked for (SUBCOMMANDS)."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*SUBCOMMANDS, *(name for name in super().list_commands(ctx) if name not in SUBCOMMANDS)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in SUBCOMMANDS and cmd_name not in self.commands:
            self.add_command(load_subcommand(cmd_name), cmd_name)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (LoglakeError, CliError) as exc:
            report_error(exc)
            raise typer.Exit(1) from None
        except ModuleNotFoundError as exc:  # an optional dependency a command needs: name its extra
            missing = missing_extra(exc, f"loglake {ctx.invoked_subcommand or ''}".strip())
            if missing is None:
                raise
            report_error(missing)
            raise typer.Exit(1) from None


app = typer.Typer(
    name="loglake",
    cls=LoglakeGroup,
    help="loglake: a Kafka-compatible, durable, append-only event log.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # click's own help layout: rich's table cut long words (env var names) with "…" at 80
    # columns and gave every flag a "<bool>" metavar
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"loglake {loglake.__version__}")
        raise typer.Exit()


@app.callback()
def _global(
    log_level: Annotated[
        str, typer.Option("--log-level", help=f"Logging level on stderr: {', '.join(LOG_LEVELS)}.")
    ] = "WARNING",
    log_format: Annotated[
        str, typer.Option("--log-format", help="text, or json (one JSON object per line, for log shippers).")
    ] = "text",
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=_version, help="Print the version and exit.")
    ] = False,
) -> None:
    level = log_level.upper()
    if level not in LOG_LEVELS:
        raise typer.BadParameter(f"must be one of {', '.join(LOG_LEVELS)}", param_hint="--log-level")
    if log_format not in ("text", "json"):
        raise typer.BadParameter("must be text or json", param_hint="--log-format")
    configure_logging(getattr(logging, level), json_lines=log_format == "json")


class _StderrHandler(logging.Handler):
    """Writes to whatever sys.stderr is at the time of the record (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


class JsonLineFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg (and exc when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def configure_logging(level: int, *, json_lines: bool = False) -> None:
    """Log to stderr at `level`; replaces only the handler an earlier call installed."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _StderrHandler):
            root.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(log_formatter(json_lines=json_lines))
    root.addHandler(handler)
    root.setLevel(level)


def log_formatter(*, json_lines: bool = False) -> logging.Formatter:
    """How every command logs a record: UTC time, level, logger, message (or one JSON object per
    line). The tests' in-process brokers write their log files with it too (tests/brokerkit.py)."""
    formatter: logging.Formatter = (
        JsonLineFormatter() if json_lines else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    formatter.converter = time.gmtime
    return formatter


def hoist_global_options(argv: list[str]) -> list[str]:
    """Move the group's own options in front of the subcommand, where click expects them."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        name = arg.split("=", 1)[0]
        if name in GLOBAL_OPTIONS:
            if "=" in arg or not GLOBAL_OPTIONS[name]:
                front.append(arg)
                i += 1
                continue
            front.extend(argv[i : i + 2])
            i += 2
            continue
        rest.append(arg)
        i += 1
    return front + rest


def main() -> None:
    """Console-script entry point."""
    try:
        app(args=hoist_global_options(sys.argv[1:]), prog_name="loglake")
    except SystemExit as exc:  # click ends every run with one
        code = 0 if exc.code is None else exc.code
        if isinstance(code, int) and interrupt.signalled():  # Ctrl-C / SIGTERM; all is closed now
            interrupt.exit_now(code)
        raise


if __name__ == "__main__":
    main()
