"""`loglake serve`: the Kafka wire-protocol broker."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from loglake.broker.config import BrokerConfig
from loglake.cli.common import error_line, note
from loglake.cli.startup import check_space, explain

log = logging.getLogger(__name__)


def serve(
    data_dir: Annotated[
        str | None, typer.Option("--data-dir", "-d", help="Data directory (env LOGLAKE_DATA_DIR; default ./loglake-data).")
    ] = None,
    cold_store: Annotated[
        str | None, typer.Option("--cold-store", help="Cold store URL (file:///path or s3://bucket/prefix?...): enables tiering.")
    ] = None,
    listen: Annotated[
        str | None, typer.Option("--listen", help="HOST:PORT to accept Kafka clients on; port 0 picks a free one.")
    ] = None,
    advertised_listener: Annotated[
        str | None, typer.Option("--advertised-listener", help="HOST:PORT put in Metadata (default: the listen address).")
    ] = None,
    port_file: Annotated[str | None, typer.Option("--port-file", help="Write the listening port to this file.")] = None,
    metrics_listen: Annotated[
        str | None, typer.Option("--metrics-listen", help="HOST:PORT for /metrics, /healthz, /readyz.")
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
    try:
        code = _serve(
            data_dir, cold_store, listen, advertised_listener, port_file, metrics_listen, config_file,
            auto_create_topics, default_partitions, print_config, accept_data_loss,
        )
    except Exception as exc:
        failure = explain(exc, data_dir or BrokerConfig.data_dir)
        if failure is None:
            raise
        log.debug("start-up failed", exc_info=True)
        error_line(failure.message)
        if failure.hint:
            note(f"hint: {failure.hint}")
        raise typer.Exit(failure.exit_code) from None
    sys.exit(code)


def _serve(
    data_dir: str | None,
    cold_store: str | None,
    listen: str | None,
    advertised_listener: str | None,
    port_file: str | None,
    metrics_listen: str | None,
    config_file: str | None,
    auto_create_topics: bool | None,
    default_partitions: int | None,
    print_config: bool = False,
    accept_data_loss: bool = False,
) -> int:
    from loglake.broker.server import run_server

    config = BrokerConfig.load(
        config_file,
        data_dir=data_dir,
        cold_store=cold_store,
        listen=listen,
        advertised_listener=advertised_listener,
        port_file=port_file,
        metrics_listen=metrics_listen,
        auto_create_topics=auto_create_topics,
        default_partitions=default_partitions,
    )
    config.accept_data_loss = accept_data_loss
    if print_config:
        sys.stdout.write(config.describe())
        return 0
    engine = config.engine_config()
    failure = check_space(
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

    def announce(host: str, port: int) -> None:
        print(f"loglake listening on {host}:{port}", flush=True)

    return run_server(config, announce)
