"""`loglake serve`: the Kafka wire-protocol broker."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer
import typer.main

from loglake.broker.config import BrokerConfig
from loglake.cli.common import error_line, note
from loglake.cli.early import install_stop_guard, program_args
from loglake.cli.startup import check_space, etcd_reachable, explain
from loglake.engine import Engine
from loglake.engine.engine import local_parts
from loglake.extras import install_command, missing_extra
from loglake.fs.os_fs import OsFileSystem
from loglake.store import accepted_store_urls

if TYPE_CHECKING:
    from loglake.broker.context import CoordinatorStores
    from loglake.broker.listeners import Listener

log = logging.getLogger(__name__)


def serve(
    data_dir: Annotated[
        str | None, typer.Option("--data-dir", "-d", help="Data directory (env LOGLAKE_DATA_DIR; default ./loglake-data).")
    ] = None,
    cold_store: Annotated[
        str | None, typer.Option("--cold-store", help=f"Cold store URL ({accepted_store_urls()}): enables tiering.")
    ] = None,
    listen: Annotated[
        list[str] | None,
        typer.Option(
            "--listen",
            help="Listener PROTOCOL://HOST:PORT (PLAINTEXT or SSL; a bare HOST:PORT is PLAINTEXT); repeat or comma-separate "
            "for several; port 0 picks a free one.",
        ),
    ] = None,
    advertised_listener: Annotated[
        list[str] | None,
        typer.Option(
            "--advertised-listener",
            help="Address put in Metadata, per listener: PROTOCOL://HOST:PORT matches the listener of that protocol, "
            "a bare HOST:PORT goes by position (default: the listen address).",
        ),
    ] = None,
    port_file: Annotated[
        str | None, typer.Option("--port-file", help="Write the listening ports to this file, one per line in listener order.")
    ] = None,
    metrics_listen: Annotated[
        str | None, typer.Option("--metrics-listen", help="HOST:PORT for /metrics, /healthz, /readyz.")
    ] = None,
    schema_registry_listen: Annotated[
        str | None,
        typer.Option("--schema-registry-listen", help="[http://|https://]HOST:PORT for the Confluent-compatible schema registry's REST API (https: with --ssl-cert)."),
    ] = None,
    ssl_cert: Annotated[str | None, typer.Option("--ssl-cert", help="PEM certificate chain of SSL listeners.")] = None,
    ssl_key: Annotated[str | None, typer.Option("--ssl-key", help="PEM private key of --ssl-cert.")] = None,
    ssl_key_password: Annotated[
        str | None, typer.Option("--ssl-key-password", help="Password of an encrypted --ssl-key (env LOGLAKE_SSL_KEY_PASSWORD).")
    ] = None,
    ssl_ca: Annotated[str | None, typer.Option("--ssl-ca", help="PEM CA certificates client certificates must chain to.")] = None,
    ssl_client_auth: Annotated[
        str | None, typer.Option("--ssl-client-auth", help="Ask SSL clients for a certificate: none, requested or required.")
    ] = None,
    ssl_principal_mapping_rules: Annotated[
        str | None,
        typer.Option(
            "--ssl-principal-mapping-rules",
            help="Kafka's ssl.principal.mapping.rules: RULE:pattern/replacement/[LU] and DEFAULT, comma-separated.",
        ),
    ] = None,
    sasl_enabled_mechanisms: Annotated[
        str | None,
        typer.Option("--sasl-enabled-mechanisms", help="Mechanisms SASL listeners offer: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (comma-separated)."),
    ] = None,
    event_loop: Annotated[
        str | None,
        typer.Option("--event-loop", help=f"asyncio (default) or uvloop (needs the fast extra: {install_command('fast')})."),
    ] = None,
    allow_unauthenticated_public_listener: Annotated[
        bool | None,
        typer.Option(
            "--allow-unauthenticated-public-listener",
            help="Start even though a listener without client authentication is on a non-loopback address.",
        ),
    ] = None,
    super_users: Annotated[
        str | None,
        typer.Option(
            "--super-users",
            help="Principals every ACL allows, separated by ';' as Kafka's super.users: 'User:admin;User:CN=ops,O=example' "
            "(a list of plain names like User:admin,User:ops still works).",
        ),
    ] = None,
    allow_everyone_if_no_acl_found: Annotated[
        bool | None,
        typer.Option(
            "--allow-everyone-if-no-acl-found/--no-allow-everyone-if-no-acl-found",
            help="Whether a resource no ACL names is open to everyone (default: only while no listener authenticates).",
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster",
            help="Cluster mode: etcd://HOST:PORT[,HOST:PORT...]/PREFIX (env LOGLAKE_CLUSTER); needs --cold-store "
            "and a --node-id unique in the cluster (docs/CLUSTER.md).",
        ),
    ] = None,
    node_id: Annotated[
        int | None, typer.Option("--node-id", help="This broker's node id (env LOGLAKE_NODE_ID; default 0).")
    ] = None,
    rack: Annotated[str | None, typer.Option("--rack", help="Kafka's broker.rack, advertised in Metadata.")] = None,
    cluster_lease_ttl_s: Annotated[
        int | None,
        typer.Option("--cluster-lease-ttl-s", help="Cluster mode: the broker's etcd lease TTL in seconds (default 3)."),
    ] = None,
    object_flush_bytes: Annotated[
        int | None,
        typer.Option("--object-flush-bytes", help="Cluster mode: flush to the bucket at this many bytes (default 4 MiB)."),
    ] = None,
    object_flush_ms: Annotated[
        int | None,
        typer.Option("--object-flush-ms", help="Cluster mode: flush to the bucket when the oldest batch is this old (default 500)."),
    ] = None,
    config_file: Annotated[str | None, typer.Option("--config", help="TOML file with broker settings.")] = None,
    auto_create_topics: Annotated[
        bool | None, typer.Option("--auto-create-topics/--no-auto-create-topics", help="Create topics on Metadata requests.")
    ] = None,
    default_partitions: Annotated[
        int | None, typer.Option("--default-partitions", help="Partitions of auto-created topics.")
    ] = None,
    print_config: Annotated[
        bool, typer.Option("--print-config", help="Print the effective configuration, with where each value came from, and exit.")
    ] = False,
    accept_data_loss: Annotated[
        bool,
        typer.Option(
            "--accept-data-loss",
            help="Start although acknowledged records are missing (a damaged WAL): the loss is logged, its offsets stay reserved.",
        ),
    ] = False,
) -> None:
    """Run the Kafka-compatible broker until SIGTERM/SIGINT (then seal, record the seals and exit 0)."""
    flags = settings_flags(locals())  # before any other name is bound: the parameters only
    try:
        code = _serve(config_file, flags, print_config, accept_data_loss)
    except Exception as exc:
        failure = explain(exc, data_dir or BrokerConfig.data_dir)
        if failure is None:
            raise
        log.debug("start-up failed", exc_info=True)
        error_line(failure.message)
        if failure.hint:
            note(f"hint: {failure.hint}")
        raise typer.Exit(failure.exit_code) from None
    if program_args() is not None:
        # The event loop gave the signals back (Python's KeyboardInterrupt): a second Ctrl-C
        # while the process exits must not print a traceback either.
        install_stop_guard(None)
    sys.exit(code)


#: `serve`'s options that are no broker setting; every other one is a flag of `BrokerConfig.load`.
COMMAND_OPTIONS = frozenset({"config_file", "print_config", "accept_data_loss"})


def settings_flags(params: Mapping[str, Any]) -> dict[str, Any]:
    """`BrokerConfig.load`'s flags from `serve`'s parameters: an option not given is None (the
    environment, the file or the default decides), a repeatable one a list."""
    return {
        name: (list(value) or None) if isinstance(value, (list, tuple)) else value
        for name, value in params.items()
        if name not in COMMAND_OPTIONS
    }


def config_of(args: Sequence[str], env: Mapping[str, str] | None = None) -> BrokerConfig:
    """The configuration `loglake serve ARGS` runs with in environment `env` (default: this
    process's), checked as `serve` checks it before opening anything. Tests run the broker
    in-process (`BrokerServer` over `compose(config)`) from the flags they would give the command."""
    from loglake.broker.listeners import check_exposure

    app = typer.Typer()
    app.command()(serve)
    with typer.main.get_command(app).make_context("serve", list(args)) as ctx:
        params = dict(ctx.params)
    config = _load(params["config_file"], settings_flags(params), params["accept_data_loss"], env)
    check_exposure(config.listeners(), config.ssl_client_auth, config.allow_unauthenticated_public_listener)
    return config


def _load(config_file: str | None, flags: dict[str, Any], accept_data_loss: bool, env: Mapping[str, str] | None = None) -> BrokerConfig:
    config = BrokerConfig.load(config_file, env, **flags)
    config.accept_data_loss = accept_data_loss
    return config


def _serve(config_file: str | None, flags: dict[str, Any], print_config: bool = False, accept_data_loss: bool = False) -> int:
    from loglake.broker.listeners import PLAINTEXT, check_exposure
    from loglake.broker.server import run_server

    config = _load(config_file, flags, accept_data_loss)
    if print_config:
        sys.stdout.write(config.describe())
        return 0
    # Safe by default (docs/SECURITY.md): exit 2 before anything is opened.
    check_exposure(config.listeners(), config.ssl_client_auth, config.allow_unauthenticated_public_listener)
    engine = config.engine_config()
    failure = None if config.cluster else check_space(
        config.data_dir,
        engine.wal_shards,
        engine.wal_file_bytes,
        engine.meta_log_file_bytes,
        engine.storage_min_free_bytes,
        engine.storage_min_free_percent,
    )
    if failure is not None:
        error_line(failure.message)
        if failure.hint:
            note(f"hint: {failure.hint}")
        return failure.exit_code

    if config.cluster is not None:
        from loglake.meta.etcd_url import parse_cluster_url

        _cluster_node()  # a missing cluster extra is told before etcd is looked for
        etcd_reachable(parse_cluster_url(config.cluster)[0])
    quiet = _QuietStartUp()

    def announce(listener: Listener, advertised: tuple[str, int]) -> None:
        quiet.end()
        # One line per listener; a PLAINTEXT one as before ("HOST:PORT"), others with their protocol.
        where = f"{listener.host}:{listener.port}"
        print(f"loglake listening on {where if listener.protocol == PLAINTEXT else listener.url()}", flush=True)

    try:
        served, stores = compose(config)
        return run_server(config, served, stores, announce)
    finally:
        quiet.end()


#: Loggers that warn on each retry of a request to the bucket or to etcd. Before the broker
#: listens, such retries only precede the one error line (and hint) that says the store or etcd
#: cannot be reached, so at the default log level they are held back until then.
RETRY_LOGGERS = ("loglake.store.s3", "loglake.cluster.etcd_client")


class _QuietStartUp:
    """RETRY_LOGGERS at ERROR from now until `end()`, when the log level is the default
    (WARNING or above); `--log-level INFO` or DEBUG shows every retry."""

    def __init__(self) -> None:
        self._levels: dict[str, int] = {}
        if logging.getLogger().getEffectiveLevel() >= logging.WARNING:
            for name in RETRY_LOGGERS:
                logger = logging.getLogger(name)
                self._levels[name] = logger.level
                logger.setLevel(logging.ERROR)

    def end(self) -> None:
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)
        self._levels.clear()


def _cluster_node() -> Callable[[BrokerConfig], tuple[Engine, CoordinatorStores]]:
    """`loglake.cluster.node.cluster_node`; a MissingExtraError when the cluster extra is not installed."""
    try:
        from loglake.cluster.node import cluster_node
    except ModuleNotFoundError as exc:
        missing = missing_extra(exc, "cluster mode (--cluster)")
        if missing is None:
            raise
        raise missing from None
    return cluster_node


def compose(config: BrokerConfig) -> tuple[Engine, CoordinatorStores | None]:
    """The engine `serve` runs (not open yet), and how its coordinators keep their state:
    the one place that reads which mode the broker runs in (`--cluster`)."""
    if config.cluster is not None:
        return _cluster_node()(config)
    data_dir = os.path.abspath(config.data_dir)
    engine_config = config.engine_config()
    parts = local_parts(data_dir, engine_config, fs=OsFileSystem(), node_id=config.node_id, rack=config.rack)
    return Engine(data_dir, engine_config, parts=parts), None
