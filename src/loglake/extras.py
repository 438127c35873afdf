"""loglake's optional dependencies: which extra of pyproject.toml installs which module.

A feature that needs one imports it only when used (`--cluster`: etcd3gw, an s3:// store: boto3,
`--event-loop uvloop`: uvloop, `loglake pipeline`: pyspark and pyiceberg,
`--schema-registry-listen`: fastavro, avro, jsonschema, proto-schema-parser and protobuf,
OAUTHBEARER's JWKS validator: jwt). When the module is not
installed, the user gets one line naming the extra and the pip command that installs it
(`MissingExtraError`, `missing_extra`) instead of a ModuleNotFoundError traceback.
"""

from __future__ import annotations

from loglake.errors import ConfigError

#: Top-level module -> the extra (pyproject.toml, [project.optional-dependencies]) that installs
#: it: the one table of them (tests/test_extras.py checks it against pyproject.toml).
EXTRA_OF_MODULE: dict[str, str] = {
    "uvloop": "fast",
    "boto3": "s3",
    "botocore": "s3",
    "etcd3gw": "cluster",
    "pyspark": "spark",
    "pyarrow": "spark",
    "numpy": "spark",
    "pandas": "spark",
    "pyiceberg": "spark",
    "fastavro": "registry",
    "avro": "registry",
    "jsonschema": "registry",
    "proto_schema_parser": "registry",
    "google": "registry",  # protobuf's package is google.protobuf
    "jwt": "oauth",
}


def install_command(extra: str) -> str:
    """The command that installs `extra`, as every message says it."""
    return f"pip install 'loglake[{extra}]'"


def install_hint(extra: str) -> str:
    """The `hint:` line's text for a missing `extra`."""
    return f"install it with: {install_command(extra)}"


class MissingExtraError(ConfigError):
    """`what` needs `module`, which is not installed; `hint` names the extra that installs it."""

    def __init__(self, what: str, module: str) -> None:
        self.module = module
        self.extra = EXTRA_OF_MODULE[module.partition(".")[0]]
        self.hint = install_hint(self.extra)
        super().__init__(f"{what} needs the {self.module} package (the {self.extra!r} extra), which is not installed")


def missing_extra(exc: BaseException, what: str) -> MissingExtraError | None:
    """`exc` (or what caused it) as a MissingExtraError when it is a ModuleNotFoundError of a module
    of EXTRA_OF_MODULE, else None (a missing module of no extra is a broken install: a bug)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, MissingExtraError):
            return seen
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            top = seen.name.partition(".")[0]
            if top in EXTRA_OF_MODULE:
                return MissingExtraError(what, top)
        seen = seen.__cause__ or seen.__context__
    return None


__all__ = ["EXTRA_OF_MODULE", "MissingExtraError", "install_command", "install_hint", "missing_extra"]
