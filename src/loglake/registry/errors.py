"""The registry's errors: Confluent's HTTP statuses, error codes and messages (the one table).

confluent-kafka's SchemaRegistryClient raises SchemaRegistryError with the `error_code` and
`message` of the body; tools match on the codes, so they are Confluent's numbers exactly.
"""

from __future__ import annotations

import enum

__all__ = ["RegistryError", "RegistryErrorCode"]


class RegistryErrorCode(enum.IntEnum):
    """Confluent Schema Registry's error codes; the HTTP status is the code's first three digits
    (409 and the plain HTTP statuses are their own)."""

    UNAUTHORIZED = 40101
    FORBIDDEN = 40301
    SUBJECT_NOT_FOUND = 40401
    VERSION_NOT_FOUND = 40402
    SCHEMA_NOT_FOUND = 40403
    SUBJECT_SOFT_DELETED = 40404
    SUBJECT_NOT_SOFT_DELETED = 40405
    SCHEMAVERSION_SOFT_DELETED = 40406
    SCHEMAVERSION_NOT_SOFT_DELETED = 40407
    SUBJECT_LEVEL_COMPATIBILITY_NOT_CONFIGURED = 40408
    SUBJECT_LEVEL_MODE_NOT_CONFIGURED = 40409
    NOT_FOUND = 404
    METHOD_NOT_ALLOWED = 405
    INCOMPATIBLE_SCHEMA = 409
    INVALID_SCHEMA = 42201
    INVALID_VERSION = 42202
    INVALID_COMPATIBILITY_LEVEL = 42203
    INVALID_MODE = 42204
    OPERATION_NOT_PERMITTED = 42205
    REFERENCE_EXISTS = 42206
    ID_DOES_NOT_MATCH = 42207
    BAD_REQUEST = 400
    PAYLOAD_TOO_LARGE = 413
    UNPROCESSABLE_ENTITY = 422
    STORE_ERROR = 50001

    @property
    def http_status(self) -> int:
        return self.value if self.value < 1000 else self.value // 100


class RegistryError(Exception):
    """An answer of the API other than success: its code and Confluent's message."""

    def __init__(self, code: RegistryErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @classmethod
    def subject_not_found(cls, subject: str) -> RegistryError:
        return cls(RegistryErrorCode.SUBJECT_NOT_FOUND, f"Subject '{subject}' not found.")

    @classmethod
    def version_not_found(cls, version: int | str) -> RegistryError:
        return cls(RegistryErrorCode.VERSION_NOT_FOUND, f"Version {version} not found.")

    @classmethod
    def schema_not_found(cls, schema_id: int | None = None) -> RegistryError:
        return cls(RegistryErrorCode.SCHEMA_NOT_FOUND, "Schema not found" if schema_id is None else f"Schema {schema_id} not found")

    @classmethod
    def invalid_version(cls, version: str) -> RegistryError:
        return cls(
            RegistryErrorCode.INVALID_VERSION,
            f"The specified version '{version}' is not a valid version id. Allowed values are between "
            '[1, 2^31-1] and the string "latest"',
        )

    @classmethod
    def unauthorized(cls) -> RegistryError:
        return cls(RegistryErrorCode.UNAUTHORIZED, "Unauthorized")

    @classmethod
    def forbidden(cls, operation: str, resource: str, subject: str) -> RegistryError:
        """Confluent's wording: "User is denied operation Write on Subject: s"."""
        what = f"{resource.capitalize()}: {subject}" if subject else resource.capitalize()
        return cls(RegistryErrorCode.FORBIDDEN, f"User is denied operation {operation.replace('_', ' ').title().replace(' ', '')} on {what}")
