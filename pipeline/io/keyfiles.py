"""The key material a user names: ``--keys`` (scope -> key, JSON) and vak's own
passphrase-sealed key file with its tenant home (``--vak-key-file``, ``--vak-tenant``);
the keys open sealed segment ledgers (docs/segments.md)."""

from __future__ import annotations

import os
import posixpath

from pipeline.errors import UsageError
from pipeline.io.storage import read_small, read_user_file
from pipeline.ledger.keys import StaticKeys, keys_from_json, open_key_file, vak_scope_keys

__all__ = ["PASSPHRASE_ENV", "load_keys"]


#: The environment variable vak's key file passphrase is read from (never a flag: a
#: command line shows in ``ps`` and in shell history).
PASSPHRASE_ENV = "VAKPIPE_KEY_PASSPHRASE"


def load_keys(keys: str | None = None, key_file: str | None = None,
              tenant: str | None = None) -> StaticKeys | None:
    """The key provider of a command: ``--keys`` (a JSON object, scope -> hex key), and/or
    vak's own key material (``--vak-key-file``, its passphrase from
    :data:`PASSPHRASE_ENV`, with the tenant home ``--vak-tenant`` holding
    ``keys/scopes/``); ``None`` when neither is given.

    Raises
    ------
    UsageError
        A file cannot be read or is malformed, the passphrase is missing or wrong, or a
        key file is given without its tenant home (no message quotes key material).
    """
    provider: StaticKeys | None = None
    if keys is not None:
        provider = keys_from_json(read_user_file(keys, f"the keys file {keys!r}"),
                                  f"--keys {keys}")
    if key_file is not None or tenant is not None:
        if key_file is None or tenant is None:
            raise UsageError("--vak-key-file and --vak-tenant go together: the key file "
                             "holds the KEKs, the tenant home the wrapped scope keys")
        passphrase = os.environ.get(PASSPHRASE_ENV)
        if not passphrase:
            raise UsageError(f"--vak-key-file needs its passphrase in ${PASSPHRASE_ENV}")
        text = read_user_file(key_file, f"the vak key file {key_file!r}").decode(
            "utf-8", "replace")
        keks = open_key_file(text, passphrase)
        from fsspec.core import url_to_fs

        fs, home = url_to_fs(tenant)
        wrapped: dict[str, bytes] = {}
        tombstones: list[str] = []
        for sub, into in (("keys", wrapped), ("tombstones", None)):
            folder = f"{home.rstrip('/')}/keys/scopes/{sub}"
            try:
                names = [posixpath.basename(n) for n in fs.ls(folder, detail=False)]
            except (OSError, ValueError):
                continue  # none of that kind
            for name in names:
                if into is None:
                    tombstones.append(name)
                else:
                    into[name] = read_small(fs, f"{folder}/{name}",
                                            f"the wrapped scope key {name!r}")
        vak = vak_scope_keys(keks, wrapped, tombstones)
        provider = vak if provider is None else vak.merged(provider)
    return provider
