"""How `loglake users` changes credentials of a data directory a running broker holds.

The data-directory lock (loglake.meta.lock) says whether a broker runs on the directory. When it
is free, `loglake users` opens the directory itself and appends to the metadata log. When a
broker holds it, nothing but the broker may write the metadata log, so the command hands its
change to the broker through an inbox directory, ``<data_dir>/users-inbox/`` (mode 0700):

1. the command writes ``<id>.request.json`` (written as ``.<id>.tmp`` then renamed, so the broker
   never reads half a request): ``{"op": "add", "user", "mechanism", "cred"}`` (cred as the
   metadata record holds it: salt, iterations, StoredKey, ServerKey: the password never reaches
   the disk), ``{"op": "delete", "user", "mechanism"}`` (mechanism null: every one) or
   ``{"op": "list"}``;
2. the broker looks every `INBOX_POLL_S`, applies at most `INBOX_REQUESTS_PER_POLL` requests
   through its metadata log (durable before it answers), writes ``<id>.result.json``
   (``{"ok": true, "users": {...}}`` or ``{"ok": false, "error": "..."}``, again through a
   rename) and removes the request;
3. the command waits at most `INBOX_WAIT_S` for the result, reads and removes it; on a timeout it
   removes its request (if the broker has not taken it) and says the broker did not answer.

Requests over `INBOX_REQUEST_BYTES_MAX` or that do not parse are answered with an error. Whoever
can write the data directory can already change anything in it, so the inbox adds no new power.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os

from loglake.broker.off_loop import OffLoop
from loglake.broker.security.scram_store import ScramStore
from loglake.errors import LoglakeError
from loglake.fs.modes import DIR_MODE, FILE_MODE
from loglake.meta.scram import to_credential
from loglake.scram import MECHANISMS

log = logging.getLogger("loglake.broker.users")

INBOX_DIR = "users-inbox"
#: How often the broker looks into the inbox.
INBOX_POLL_S = 0.2
#: Most requests the broker applies per look (the rest wait for the next one).
INBOX_REQUESTS_PER_POLL = 100
#: Largest request file read.
INBOX_REQUEST_BYTES_MAX = 64 * 1024
#: How long `loglake users` waits for the broker's answer.
INBOX_WAIT_S = 15.0
REQUEST_SUFFIX = ".request.json"
RESULT_SUFFIX = ".result.json"


def inbox_path(data_dir: str) -> str:
    return os.path.join(data_dir, INBOX_DIR)


#: A request or a result: a JSON object.
Doc = dict[str, object]


def write_atomically(directory: str, name: str, doc: Doc) -> None:
    tmp = os.path.join(directory, f".{name}.tmp")
    # a request holds a user's StoredKey and ServerKey: the broker's user's only, like the metadata
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE), "w") as fh:
        json.dump(doc, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, os.path.join(directory, name))


def list_users(store: ScramStore) -> dict[str, dict[str, int]]:
    """user -> mechanism -> iterations."""
    table = store.credentials()
    return {
        u: {m: int(c["iterations"]) for m, c in sorted(mechs.items())} for u, mechs in sorted(table.items())
    }


def apply_request(store: ScramStore, doc: Doc) -> Doc:
    """Apply one request (from the inbox, or the command itself when it holds the directory);
    a metadata log that cannot be written (a failed engine, a full disk) is an error answer."""
    try:
        return _apply(store, doc)
    except LoglakeError as exc:
        return {"ok": False, "error": f"not applied: {exc}"}


def _apply(store: ScramStore, doc: Doc) -> Doc:
    op = doc.get("op")
    if op not in ("list", "add", "delete"):
        return {"ok": False, "error": f"unknown operation {op!r}"}
    if op == "list":
        return {"ok": True, "users": list_users(store)}
    user, mechanism = doc.get("user"), doc.get("mechanism")
    if not isinstance(user, str) or not user:
        return {"ok": False, "error": "a user name is needed"}
    if op == "add":
        cred = doc.get("cred")
        if not isinstance(mechanism, str) or mechanism not in MECHANISMS or not isinstance(cred, dict):
            return {"ok": False, "error": f"add needs a mechanism ({', '.join(MECHANISMS)}) and a credential"}
        try:
            to_credential(mechanism, cred)
            store.save(user, mechanism, cred)
        except (ValueError, KeyError, TypeError) as exc:
            return {"ok": False, "error": f"credential refused: {exc}"}
        return {"ok": True}
    # delete
    have = store.credentials().get(user, {})
    wanted: list[object] = list(have) if mechanism is None else [mechanism]
    missing = [m for m in wanted if m not in have]
    if not wanted or missing:
        what = f"{missing[0]} credential" if missing else "credentials"
        return {"ok": False, "error": f"user {user!r} has no {what}"}
    for m in wanted:
        store.save(user, str(m), None)  # one of `have`: a mechanism name
    return {"ok": True}


def _answer(store: ScramStore, directory: str, name: str) -> None:
    path = os.path.join(directory, name)
    rid = name[: -len(REQUEST_SUFFIX)]
    try:
        if os.path.getsize(path) > INBOX_REQUEST_BYTES_MAX:
            result: Doc = {"ok": False, "error": f"request over {INBOX_REQUEST_BYTES_MAX} bytes"}
        else:
            with open(path) as fh:
                doc = json.load(fh)
            result = (
                apply_request(store, doc)
                if isinstance(doc, dict)
                else {"ok": False, "error": "not a JSON object"}
            )
    except (OSError, ValueError) as exc:
        result = {"ok": False, "error": f"unreadable request: {exc}"}
    write_atomically(directory, rid + RESULT_SUFFIX, result)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    log.info(
        "users inbox: %s %s -> %s",
        rid,
        "ok" if result.get("ok") else "refused",
        result.get("error", "applied"),
    )


def poll_once(store: ScramStore, data_dir: str) -> int:
    """Answer the requests waiting in the inbox (at most INBOX_REQUESTS_PER_POLL); how many."""
    directory = inbox_path(data_dir)
    try:
        names = sorted(
            n for n in os.listdir(directory) if n.endswith(REQUEST_SUFFIX) and not n.startswith(".")
        )
    except FileNotFoundError:
        return 0
    for name in names[:INBOX_REQUESTS_PER_POLL]:
        _answer(store, directory, name)
    return min(len(names), INBOX_REQUESTS_PER_POLL)


async def serve_inbox(store: ScramStore, data_dir: str, off_loop: OffLoop) -> None:
    """The broker's poller (a task of the server, cancelled at shutdown)."""
    os.makedirs(inbox_path(data_dir), mode=DIR_MODE, exist_ok=True)
    while True:
        await asyncio.sleep(INBOX_POLL_S)
        try:
            await off_loop(poll_once, store, data_dir)
        except Exception as exc:  # a failed engine, a full disk: say so, keep polling
            log.warning("users inbox: %s", exc)
            await asyncio.sleep(INBOX_WAIT_S)
