"""One schema for the broker's settings, whichever of the three sources they come from.

Every field of `BrokerConfig` is a setting; every field of `EngineConfig` is one too, under the
TOML table ``[engine]``. A value can come from

* a flag (``--listen``; the serve command passes flags it was given),
* the environment: ``LOGLAKE_<NAME>`` for broker settings, ``LOGLAKE_ENGINE__<NAME>`` for engine
  settings (``LOGLAKE_<NAME>`` also works for an engine setting whose name no broker setting has,
  e.g. ``LOGLAKE_MEMORY_BUDGET_BYTES``),
* the TOML file given with ``--config`` (top level, ``[engine]``, ``[topic_defaults]``),
* the default,

in that order of precedence. Each value is checked for its type and, where `BOUNDS` names one,
its range, and an error names the setting, the bad value, where it came from (``--flag``,
``LOGLAKE_X``, ``FILE:LINE``) and what is allowed. `Loaded.sources` keeps where every effective
value came from, for ``loglake serve --print-config``.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from loglake.engine.config import EngineConfig
from loglake.errors import ConfigError

ENV_PREFIX = "LOGLAKE_"
ENGINE_ENV_PREFIX = "LOGLAKE_ENGINE__"
#: Fields of BrokerConfig that are not settings themselves: TOML tables, and where values came from.
TABLES = ("engine", "topic_defaults", "sources")
#: EngineConfig fields that are no setting: topic defaults have their own table, and accepting a
#: loss of acknowledged data is a one-time decision (`serve --accept-data-loss`), never a default.
NOT_SETTINGS = frozenset({"topic_defaults", "accept_data_loss"})
INT32_MAX = 2**31 - 1

#: Inclusive ranges of broker settings (engine ranges are checked by `EngineConfig.validate`).
BOUNDS: dict[str, tuple[float, float]] = {
    "node_id": (0, INT32_MAX),
    "default_partitions": (1, 10_000),
    "cluster_lease_ttl_s": (2, 3600),
    "object_flush_bytes": (1024, 64 * 1024 * 1024),  # at most the flush buffer's bound
    "object_flush_ms": (1, 3_600_000),
    "cluster_maintenance_interval_ms": (100, 24 * 3600 * 1000),
    "max_frame_bytes": (1024 * 1024, INT32_MAX),
    "max_inflight_per_connection": (1, 10_000),
    "idle_timeout_ms": (1_000, 7 * 24 * 3600 * 1000),
    "max_connections": (1, 1_000_000),
    "queued_max_request_bytes": (1024 * 1024, 2**40),
    "group_initial_rebalance_delay_ms": (0, 300_000),
    "group_min_session_timeout_ms": (1, INT32_MAX),
    "group_max_session_timeout_ms": (1, INT32_MAX),
    "offsets_retention_minutes": (1, 10 * 365 * 24 * 60),
    "log_rate_limit_ms": (0, 24 * 3600 * 1000),
    "connection_failed_authentication_delay_ms": (0, 60_000),
    "max_incremental_fetch_session_cache_slots": (0, 1_000_000),
    "min_incremental_fetch_session_eviction_ms": (100, 24 * 3600 * 1000),
    "fetch_session_max_partitions": (1, 1_000_000),
    "transaction_max_timeout_ms": (1, INT32_MAX),
    "transactional_id_expiration_ms": (1, INT32_MAX),
    "transaction_abort_timed_out_transaction_cleanup_interval_ms": (1, INT32_MAX),
    "transactional_ids_max": (1, 10_000_000),
    "quota_window_num": (2, 1000),
    "quota_window_size_seconds": (1, 3600),
}


@dataclass
class Loaded:
    """Values by setting name (engine settings as ``engine.NAME``) and where each came from."""

    values: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    topic_defaults: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


def _kind(f: dataclasses.Field[Any]) -> type:
    """The Python type a setting holds, from its annotation (`from __future__` makes it a string)."""
    ann = str(f.type).replace(" ", "")
    for name, kind in (("bool", bool), ("int", int), ("float", float), ("str", str), ("dict", dict), ("list", list)):
        if ann == name or ann.startswith(f"{name}|") or ann.startswith(f"{name}[") or ann.endswith(f"|{name}"):
            return kind
    raise TypeError(f"setting {f.name}: unsupported annotation {f.type!r}")


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def _describe(kind: type) -> str:
    return {
        bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a table",
        list: "a list of strings (or one comma-separated string)",
    }[kind]


def _range_text(name: str) -> str:
    lo, hi = BOUNDS[name]
    return f"[{lo:g}, {hi:g}]" if isinstance(lo, float) else f"[{int(lo)}, {int(hi)}]"


def check_value(name: str, kind: type, value: Any, source: str, *, from_text: bool) -> Any:
    """`value` as the setting's type, or ConfigError naming setting, value, source and what is allowed."""
    shown = f"{name}={value!r} (from {source})"
    if kind is list:
        # A list setting (listeners): a TOML array or tuple of strings, or a comma-separated string.
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return [part.strip() for v in value for part in v.split(",") if part.strip()]
        raise ConfigError(f"{shown}: expected {_describe(kind)}, got {type(value).__name__}")
    if from_text and kind is not str:
        text = str(value).strip()
        try:
            if kind is bool:
                if text.lower() in ("1", "true", "yes", "on"):
                    value = True
                elif text.lower() in ("0", "false", "no", "off"):
                    value = False
                else:
                    raise ValueError(text)
            elif kind is int:
                value = int(text.replace("_", ""))
            elif kind is float:
                value = float(text)
        except ValueError:
            raise ConfigError(f"{shown}: expected {_describe(kind)}") from None
    ok = (
        (kind is bool and isinstance(value, bool))
        or (kind is int and isinstance(value, int) and not isinstance(value, bool))
        or (kind is float and isinstance(value, int | float) and not isinstance(value, bool))
        or (kind is str and isinstance(value, str))
        or (kind is dict and isinstance(value, dict))
    )
    if not ok:
        raise ConfigError(f"{shown}: expected {_describe(kind)}, got {type(value).__name__}")
    if name in BOUNDS:
        lo, hi = BOUNDS[name]
        if not lo <= value <= hi:
            raise ConfigError(f"{shown}: out of range, allowed {_range_text(name)}")
    return float(value) if kind is float else value


def _toml_lines(text: str) -> dict[tuple[str, str], int]:
    """(table, key) -> line number of its assignment ('' is the top level)."""
    out: dict[tuple[str, str], int] = {}
    table = ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        header = re.match(r"^\[\s*([A-Za-z0-9_.\-]+)\s*\]", stripped)
        if header:
            table = header.group(1)
            continue
        key = re.match(r'^(?:"([^"]+)"|\'([^\']+)\'|([A-Za-z0-9_\-]+))\s*=', stripped)
        if key:
            out.setdefault((table, next(g for g in key.groups() if g is not None)), number)
    return out


def load_settings(
    broker_fields: tuple[dataclasses.Field[Any], ...],
    config_file: str | None,
    env: Mapping[str, str],
    flags: Mapping[str, Any],
) -> Loaded:
    """Read the three sources into checked values with their sources (see the module doc)."""
    out = Loaded()
    broker = {f.name: f for f in broker_fields if f.name not in TABLES}
    engine = {f.name: f for f in fields(EngineConfig) if f.name not in NOT_SETTINGS}
    for name, f in broker.items():
        out.values[name] = _default(f)
        out.sources[name] = "default"
    for name in engine:
        out.sources[f"engine.{name}"] = "default"
    if config_file:
        try:
            with open(config_file, "rb") as fh:
                raw_bytes = fh.read()
            raw = tomllib.loads(raw_bytes.decode("utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc}") from None
        lines = _toml_lines(raw_bytes.decode("utf-8"))

        def where(table: str, key: str) -> str:
            number = lines.get((table, key))
            return f"{config_file}:{number}" if number is not None else config_file

        for key, value in raw.items():
            name = key.replace("-", "_").replace(".", "_")
            if name == "engine":
                if not isinstance(value, dict):
                    raise ConfigError(f"engine={value!r} (from {where('', key)}): expected a table [engine]")
                for ekey, evalue in value.items():
                    ename = ekey.replace("-", "_")
                    if ename == "topic_defaults" and isinstance(evalue, dict):
                        out.topic_defaults.update({str(k): str(v) for k, v in evalue.items()})
                        continue
                    if ename not in engine:
                        raise ConfigError(f"{where('engine', ekey)}: unknown engine setting {ekey!r}; known: {', '.join(sorted(engine))}")
                    src = where("engine", ekey)
                    out.engine[ename] = check_value(f"engine.{ename}", _kind(engine[ename]), evalue, src, from_text=False)
                    out.sources[f"engine.{ename}"] = src
            elif name == "topic_defaults":
                if not isinstance(value, dict):
                    raise ConfigError(f"topic_defaults={value!r} (from {where('', key)}): expected a table [topic_defaults]")
                for tkey, tvalue in value.items():
                    out.topic_defaults[str(tkey)] = str(tvalue).lower() if isinstance(tvalue, bool) else str(tvalue)
                    out.sources[f"topic_defaults.{tkey}"] = where("topic_defaults", str(tkey))
            elif name in broker:
                src = where("", key)
                out.values[name] = check_value(name, _kind(broker[name]), value, src, from_text=False)
                out.sources[name] = src
            else:
                raise ConfigError(f"{where('', key)}: unknown setting {key!r}; known: {', '.join(sorted(broker))}, [engine], [topic_defaults]")
    for var, text in env.items():
        if var.startswith(ENGINE_ENV_PREFIX):
            ename = var[len(ENGINE_ENV_PREFIX) :].lower()
            if ename not in engine:
                raise ConfigError(f"{var}: unknown engine setting {ename!r}; known: {', '.join(sorted(engine))}")
            out.engine[ename] = check_value(f"engine.{ename}", _kind(engine[ename]), text, var, from_text=True)
            out.sources[f"engine.{ename}"] = var
        elif var.startswith(ENV_PREFIX):
            name = var[len(ENV_PREFIX) :].lower()
            if name in broker:
                out.values[name] = check_value(name, _kind(broker[name]), text, var, from_text=True)
                out.sources[name] = var
            elif name in engine and f"{ENGINE_ENV_PREFIX}{name.upper()}" not in env:
                out.engine[name] = check_value(f"engine.{name}", _kind(engine[name]), text, var, from_text=True)
                out.sources[f"engine.{name}"] = var
    for name, value in flags.items():
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        out.values[name] = check_value(name, _kind(broker[name]), value, flag, from_text=False)
        out.sources[name] = flag
    return out


def render(values: Mapping[str, Any], engine: Mapping[str, Any], topic_defaults: Mapping[str, str], sources: Mapping[str, str]) -> str:
    """The effective configuration as TOML, each value followed by a comment saying where it came
    from; unset optional settings are shown commented out."""

    def line(name: str, value: Any, source: str) -> str:
        if value is None:
            return f"# {name} is unset  # {source}"
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, list):
            text = "[" + ", ".join('"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"' for v in value) + "]"
        elif isinstance(value, int | float):
            text = repr(value)
        else:
            text = '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
        return f"{name} = {text}  # {source}"

    lines = [line(n, v, sources.get(n, "default")) for n, v in values.items() if n not in TABLES]
    lines += ["", "[engine]"]
    lines += [line(n, v, sources.get(f"engine.{n}", "default")) for n, v in engine.items() if n not in NOT_SETTINGS]
    lines += ["", "[topic_defaults]"]
    lines += [line(f'"{n}"', v, sources.get(f"topic_defaults.{n}", "default")) for n, v in sorted(topic_defaults.items())]
    return "\n".join(lines) + "\n"


__all__ = ["BOUNDS", "ENGINE_ENV_PREFIX", "ENV_PREFIX", "Loaded", "check_value", "load_settings", "render"]
