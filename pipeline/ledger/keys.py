"""Where the keys of sealed segment ledgers come from (docs/segments.md). Pure.

A segment ledger's frames are sealed under the key of a *scope* (the ledger's ``KEY``
file names it, e.g. ``conversation:<session id>``). vakpipe never needs a key to verify a
ledger; it needs one to read its content. A :class:`KeyProvider` gives the 32-byte key of
a scope, or ``None``; two ship:

* :class:`StaticKeys`: a mapping scope -> key, read from a JSON object of hex keys
  (``--keys FILE``, :func:`keys_from_json`);
* vak's own key material, its passphrase-sealed key file (:func:`open_key_file`) and
  the tenant's ``keys/scopes/`` folder, each scope key unwrapped as vak does
  (:func:`vak_scope_keys`, a :class:`StaticKeys` too).

Key material never reaches a table, a log line or an error message: the providers'
``repr`` names how many scopes they hold, never a key, and the errors below say what is
wrong with a file without quoting it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, runtime_checkable

from pipeline.errors import UsageError

KEY_LEN = 32
NONCE_LEN = 12
#: The first line of vak's key file, and the additional data of its sealed text.
KEY_FILE_MAGIC = "vakyartha-key-file-1"


@runtime_checkable
class KeyProvider(Protocol):
    """Gives the key of a scope, or ``None`` (unknown, or shredded)."""

    def scope_key(self, scope: str) -> bytes | None:
        """The 32-byte key of ``scope``, or ``None`` when this provider has none."""
        ...

    def shredded(self, scope: str) -> bool:
        """Whether ``scope``'s key is known to have been destroyed (crypto-shredded)."""
        ...


class StaticKeys:
    """Keys given directly: scope name -> 32-byte key (picklable; travels to workers)."""

    __slots__ = ("_keys", "_shredded")

    def __init__(self, keys: Mapping[str, bytes],
                 shredded: frozenset[str] = frozenset()) -> None:
        for scope, key in keys.items():
            if not isinstance(scope, str) or len(key) != KEY_LEN:
                raise UsageError("a scope key must be 32 bytes under a scope name")
        self._keys = dict(keys)
        self._shredded = shredded

    def scope_key(self, scope: str) -> bytes | None:
        """The key of ``scope``, if given."""
        return self._keys.get(scope)

    def shredded(self, scope: str) -> bool:
        """Whether the scope is known shredded (a tombstone of vak's key material)."""
        return scope in self._shredded

    def merged(self, other: StaticKeys) -> StaticKeys:
        """These keys and ``other``'s (``other`` wins a scope both hold)."""
        return StaticKeys({**self._keys, **other._keys}, self._shredded | other._shredded)

    def __repr__(self) -> str:  # never the keys
        return f"StaticKeys(<{len(self._keys)} scopes>)"

    def __getstate__(self) -> tuple[dict[str, bytes], frozenset[str]]:
        return self._keys, self._shredded

    def __setstate__(self, state: tuple[dict[str, bytes], frozenset[str]]) -> None:
        self._keys, self._shredded = state


def keys_from_json(text: str | bytes, what: str = "the keys file") -> StaticKeys:
    """A :class:`StaticKeys` from a JSON object mapping scope name to the key in hex.

    Raises
    ------
    UsageError
        Not a JSON object of 64-hex-digit strings; the message never quotes a value.
    """
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise UsageError(f"{what} is not JSON (line {getattr(err, 'lineno', '?')})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{what} must be a JSON object: scope name -> 32-byte key in hex")
    keys: dict[str, bytes] = {}
    for n, (scope, value) in enumerate(data.items(), 1):
        try:
            key = bytes.fromhex(value) if isinstance(value, str) else b""
        except ValueError:
            key = b""
        if len(key) != KEY_LEN:
            # The scope is named (it is no secret), the value never.
            raise UsageError(f"{what}: the value of entry {n} ({scope[:80]!r}) is not a "
                             "32-byte key in hex (64 hex digits)")
        keys[scope] = key
    return StaticKeys(keys)


def open_sealed(key: bytes, sealed: bytes, aad: bytes) -> bytes | None:
    """Open vak's ``nonce (12) || ciphertext || tag (16)`` under AES-256-GCM; ``None``
    when it does not open (another key, changed bytes, too short)."""
    # cryptography is imported on first use: a command that reads no sealed ledger never
    # pays for it (``vakpipe`` starts in ~0.1 s).
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if len(sealed) < NONCE_LEN + 16 or len(key) != KEY_LEN:
        return None
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_LEN], sealed[NONCE_LEN:], aad)
    except InvalidTag:
        return None


def opener(key: bytes) -> Callable[[bytes, bytes], bytes | None]:
    """:func:`open_sealed` under one key, its cipher made once (per ledger, not per
    frame)."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    decrypt = AESGCM(key).decrypt

    def open_one(sealed: bytes, aad: bytes) -> bytes | None:
        if len(sealed) < NONCE_LEN + 16:
            return None
        try:
            return decrypt(sealed[:NONCE_LEN], sealed[NONCE_LEN:], aad)
        except InvalidTag:
            return None

    return open_one


def seal_bytes(key: bytes, nonce: bytes, data: bytes, aad: bytes) -> bytes:
    """Seal as vak does: ``nonce || AES-256-GCM(data) || tag`` (for writers and tests)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return nonce + AESGCM(key).encrypt(nonce, data, aad)


def scope_file_name(scope: str) -> str:
    """The file name of a scope's wrapped key under ``keys/scopes/keys/``: the hex of
    the scope name's UTF-8 bytes."""
    return scope.encode("utf-8").hex()


def wrap_scope_key(kek_version: int, kek: bytes, scope: str, key: bytes,
                   nonce: bytes) -> bytes:
    """A scope key wrapped as vak stores it (for writers and tests)."""
    head = struct.pack("<I", kek_version)
    name = scope.encode("utf-8")
    return (head + struct.pack("<I", len(name)) + name
            + seal_bytes(kek, nonce, key, head + name))


def unwrap_scope_key(blob: bytes, keks: Mapping[int, bytes], scope: str) -> bytes | None:
    """The scope key of a wrapped file, or ``None`` when it does not open (another
    scope, an unknown KEK version, a changed file)."""
    if len(blob) < 8:
        return None
    version, length = struct.unpack_from("<II", blob)
    name = blob[8:8 + length]
    kek = keks.get(version)
    if kek is None or name != scope.encode("utf-8"):
        return None
    key = open_sealed(kek, blob[8 + length:], blob[:4] + name)
    return key if key is not None and len(key) == KEY_LEN else None


def open_key_file(text: str, passphrase: str) -> dict[int, bytes]:
    """The KEKs (version -> key) of vak's passphrase-sealed key file.

    The file is four lines: ``vakyartha-key-file-1``, the PBKDF2 iterations, the salt
    (hex) and the sealed text (hex), sealed under PBKDF2-HMAC-SHA256(passphrase, salt,
    iterations) with the first line as additional data. The text is the id key, the
    signing key, then every KEK version (hex), oldest first: version 0 is the first.

    Raises
    ------
    UsageError
        Not a key file, or the passphrase does not open it (never quoting either).
    """
    lines = text.strip().splitlines()
    try:
        if len(lines) < 4 or lines[0].strip() != KEY_FILE_MAGIC:
            raise ValueError
        iterations = int(lines[1])
        salt, sealed = bytes.fromhex(lines[2].strip()), bytes.fromhex(lines[3].strip())
        if not 0 < iterations <= 10**8:
            raise ValueError
    except ValueError:
        raise UsageError(f"the key file is not a vak key file ({KEY_FILE_MAGIC})") from None
    secret = hashlib.pbkdf2_hmac("sha256", passphrase.encode("utf-8"), salt, iterations)
    opened = open_sealed(secret, sealed, KEY_FILE_MAGIC.encode())
    try:
        if opened is None:
            raise ValueError
        plain = opened.decode("utf-8")
    except ValueError:
        raise UsageError("the key file does not open with the passphrase given") from None
    keks: dict[int, bytes] = {}
    # Every KEK version, oldest first: version n is the n-th (0-based), as vak's vault
    # names them (VAK_TENANT_KEK_<n>).
    for version, line in enumerate(plain.splitlines()[2:]):
        try:
            keks[version] = bytes.fromhex(line.strip())
        except ValueError:
            raise UsageError("the key file's key list is malformed") from None
    if not keks:
        raise UsageError("the key file holds no KEK")
    return keks


def vak_scope_keys(keks: Mapping[int, bytes], wrapped: Mapping[str, bytes],
                   tombstones: Iterable[str] = ()) -> StaticKeys:
    """The scope keys of a tenant, unwrapped as vak does.

    Parameters
    ----------
    keks:
        The KEKs of the key file (:func:`open_key_file`).
    wrapped:
        The files of ``keys/scopes/keys/``: name (the hex of the scope name) -> bytes.
    tombstones:
        The names of the files of ``keys/scopes/tombstones/`` (shredded scopes).

    A file that does not unwrap (unknown KEK version, changed bytes, a name that is not
    its scope's) is left out: its ledgers read as sealed, as without a key.
    """
    keys: dict[str, bytes] = {}
    shredded = set()
    for name in tombstones:
        try:
            shredded.add(bytes.fromhex(name).decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
    for name, blob in wrapped.items():
        try:
            scope = bytes.fromhex(name).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            continue
        if scope in shredded:
            continue
        key = unwrap_scope_key(blob, keks, scope)
        if key is not None:
            keys[scope] = key
    return StaticKeys(keys, frozenset(shredded))
