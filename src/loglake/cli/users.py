"""`loglake users add|list|delete`: SCRAM credentials of SASL users (docs/SECURITY.md, "Users").

The password is read from stdin (--password-stdin) or prompted for, salted and iterated here
(loglake.scram), and only the derived credential goes anywhere. With the data directory free the
command opens it and appends to its metadata log; while a broker holds it the change goes
through the broker's inbox (loglake.broker.security.users_inbox), so the two never race. With
--bootstrap-server the command talks to a broker over the Kafka protocol instead
(DescribeUserScramCredentials / AlterUserScramCredentials through confluent-kafka's AdminClient,
on a PLAINTEXT listener: the command has no TLS or SASL settings of its own).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from concurrent.futures import Future
from typing import Annotated, Any, cast

import typer
from rich.table import Table

from loglake.broker.security.scram_store import ScramStore
from loglake.broker.security.users_inbox import (
    INBOX_POLL_S,
    INBOX_WAIT_S,
    REQUEST_SUFFIX,
    RESULT_SUFFIX,
    apply_request,
    inbox_path,
    write_atomically,
)
from loglake.cli.command_config import CommandConfigOption
from loglake.cli.common import CliError, DataDirOption, open_log, stdout_console
from loglake.cli.remote import BootstrapOption, Remote, result
from loglake.errors import DataDirLockedError
from loglake.meta.scram import credential_body
from loglake.scram import ITERATIONS_DEFAULT, ITERATIONS_MAX, ITERATIONS_MIN, MECHANISMS, make_credential

app = typer.Typer(
    help="SCRAM users of SASL listeners (with or without a broker running on --data-dir).",
    no_args_is_help=True,
)

#: Longest password read from stdin.
PASSWORD_BYTES_MAX = 1024

MechanismOption = Annotated[
    list[str] | None,
    typer.Option("--mechanism", "-m", help=f"SCRAM mechanism ({', '.join(MECHANISMS)}); repeatable."),
]


def _mechanisms(values: list[str] | None, default: list[str]) -> list[str]:
    out = [v.upper() for v in (values or default)]
    bad = [m for m in out if m not in MECHANISMS]
    if bad:
        raise typer.BadParameter(
            f"{', '.join(bad)}: one of {', '.join(MECHANISMS)}", param_hint="--mechanism"
        )
    return list(dict.fromkeys(out))


def _password(from_stdin: bool) -> str:
    if from_stdin:
        line = sys.stdin.readline(PASSWORD_BYTES_MAX + 1)
        password = line.rstrip("\r\n")
        if len(password.encode("utf-8")) > PASSWORD_BYTES_MAX:
            raise CliError(f"the password is over {PASSWORD_BYTES_MAX} bytes")
    elif sys.stdin.isatty():
        password = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    else:
        raise CliError(
            "no password: pass --password-stdin and write it on stdin, or run in a terminal to be asked"
        )
    if not password:
        raise CliError("the password is empty")
    return password


def _run(data_dir: str, requests: list[dict[str, Any]], bootstrap: str | None = None) -> list[dict[str, Any]]:
    """Apply the requests to the directory itself when it is free, else through the broker's inbox
    (or, with `bootstrap`, through a broker's Kafka admin APIs)."""
    if bootstrap:
        return _via_admin(bootstrap, requests)
    try:
        with open_log(data_dir, must_exist=False) as log:
            store = ScramStore.of(log.engine)
            return [apply_request(store, r) for r in requests]
    except CliError as exc:
        if "in use by another loglake process" not in str(exc):
            raise
    except DataDirLockedError:
        pass
    return [_via_broker(data_dir, r) for r in requests]


def _via_broker(data_dir: str, request: dict[str, Any]) -> dict[str, Any]:
    directory = inbox_path(data_dir)
    if not os.path.isdir(directory):
        raise CliError(
            f"a process holds {data_dir} but it has no {directory}: is it a loglake broker of this version?"
        )
    rid = f"{time.time_ns()}-{uuid.uuid4().hex[:8]}"
    write_atomically(directory, rid + REQUEST_SUFFIX, request)
    result_path = os.path.join(directory, rid + RESULT_SUFFIX)
    deadline = time.monotonic() + INBOX_WAIT_S
    while time.monotonic() < deadline:
        try:
            with open(result_path) as fh:
                result: dict[str, Any] = json.load(fh)
        except FileNotFoundError:
            time.sleep(INBOX_POLL_S / 2)
            continue
        os.unlink(result_path)
        return result
    try:
        os.unlink(os.path.join(directory, rid + REQUEST_SUFFIX))
    except FileNotFoundError:
        pass
    raise CliError(
        f"the broker running on {data_dir} did not answer within {INBOX_WAIT_S:.0f} s (is it stuck or stopping?)"
    )


def _via_admin(bootstrap: str, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    admin = Remote(bootstrap).admin

    def described() -> dict[str, dict[str, int]]:
        future = cast(
            "Future[dict[str, Any]]", admin.describe_user_scram_credentials()
        )  # users=None: one future
        table = result(future, "describe SCRAM credentials")
        return {
            u: {
                ScramMechanism(i.mechanism).name.replace("_", "-"): i.iterations
                for i in d.scram_credential_infos
            }
            for u, d in sorted(table.items())
        }

    out: list[dict[str, Any]] = []
    for r in requests:
        if r["op"] == "list":
            out.append({"ok": True, "users": described()})
            continue
        user = r["user"]
        if r["op"] == "add":
            mech = ScramMechanism[r["mechanism"].replace("-", "_")]
            change: Any = UserScramCredentialUpsertion(
                user, ScramCredentialInfo(mech, r["iterations"]), r["password"].encode()
            )
            changes = [change]
        else:
            have = described().get(user, {})
            names = list(have) if r["mechanism"] is None else [r["mechanism"]]
            changes = [UserScramCredentialDeletion(user, ScramMechanism[m.replace("-", "_")]) for m in names]
            if not changes:
                out.append({"ok": False, "error": f"user {user!r} has no credentials"})
                continue
        result(admin.alter_user_scram_credentials(changes)[user], f"user {user}")
        out.append({"ok": True})
    return out


def _check(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for r in results:
        if not r.get("ok"):
            raise CliError(str(r.get("error")))
    return results


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="User name (the principal is User:NAME).")],
    mechanism: MechanismOption = None,
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="Read the password from the first line of stdin.")
    ] = False,
    iterations: Annotated[
        int, typer.Option("--iterations", min=ITERATIONS_MIN, max=ITERATIONS_MAX, help="PBKDF2 iterations.")
    ] = ITERATIONS_DEFAULT,
    data_dir: DataDirOption = "./loglake-data",
    bootstrap: BootstrapOption = None,
_command_config: CommandConfigOption = None,
) -> None:
    """Add a user, or set a new password (a credential per --mechanism; default SCRAM-SHA-512)."""
    mechs = _mechanisms(mechanism, ["SCRAM-SHA-512"])
    password = _password(password_stdin)
    if bootstrap:  # the broker salts and derives (AlterUserScramCredentials carries the salted password)
        requests = [
            {"op": "add", "user": name, "mechanism": m, "iterations": iterations, "password": password}
            for m in mechs
        ]
    else:
        requests = [
            {
                "op": "add",
                "user": name,
                "mechanism": m,
                "cred": credential_body(make_credential(m, password, iterations)),
            }
            for m in mechs
        ]
    _check(_run(data_dir, requests, bootstrap))
    stdout_console().print(
        f"user {name}: {', '.join(mechs)} credential set ({iterations} iterations)", markup=False
    )


@app.command("delete")
def delete(
    name: Annotated[str, typer.Argument(help="User name.")],
    mechanism: MechanismOption = None,
    data_dir: DataDirOption = "./loglake-data",
    bootstrap: BootstrapOption = None,
_command_config: CommandConfigOption = None,
) -> None:
    """Delete a user's credentials (only those of --mechanism when given)."""
    mechs: list[str | None] = list(_mechanisms(mechanism, [])) if mechanism else [None]
    _check(_run(data_dir, [{"op": "delete", "user": name, "mechanism": m} for m in mechs], bootstrap))
    stdout_console().print(
        f"user {name}: {', '.join(m for m in mechs if m) or 'every'} credential deleted", markup=False
    )


@app.command("list")
def list_(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON: user -> mechanism -> iterations.")
    ] = False,
    data_dir: DataDirOption = "./loglake-data",
    bootstrap: BootstrapOption = None,
_command_config: CommandConfigOption = None,
) -> None:
    """Users with SCRAM credentials, their mechanisms and iterations (never a secret)."""
    users: dict[str, dict[str, int]] = _check(_run(data_dir, [{"op": "list"}], bootstrap))[0]["users"]
    if as_json:
        typer.echo(json.dumps(users, indent=2))
        return
    console = stdout_console()
    if not users:
        console.print("no users", markup=False)
        return
    table = Table()
    for col in ("user", "mechanisms"):
        table.add_column(col)
    for user, mechs in users.items():
        table.add_row(user, ", ".join(f"{m} ({i} iterations)" for m, i in mechs.items()))
    console.print(table)
