"""Encryption and authentication for domo's endpoints: CURVE for ZeroMQ, TLS for NNG.

ZeroMQ's CURVE mechanism (RFC 26, CurveZMQ) encrypts a connection and proves each side holds
the secret key behind its public key. The broker is the CURVE *server*: it has a key pair, and
every client and worker must know its public key in advance. Each client and worker has a key
pair of its own; the broker admits only those whose public key is on its *allow-list*, checked
by a ZAP handler (RFC 27: a socket on ``inproc://zeromq.zap.01`` in the broker's context that
libzmq asks about each new connection). A peer whose key is not allowed never completes the
handshake: nothing it sends reaches the broker, so it is never served and costs the others
nothing but a refused handshake. See docs/security.md for when to turn it on.

- ``KeyPair``, ``write_keypair`` (what ``domo keygen`` does), ``load_keypair``,
  ``load_public_key``: keys in ZeroMQ's certificate format (the ``zcert`` text files of czmq and
  pyzmq's ``zmq.auth``), Z85-encoded; a secret key file is created mode 0600.
- ``AllowList``: public keys from a text file, one per line; ``reload()`` re-reads it (the
  ``domo broker`` command does so on SIGHUP) and keeps the old list if the new file is bad.
- ``CurveServer`` / ``CurveClient``: what a broker / a client or worker needs; ``apply`` sets
  the options on a socket before it binds or connects.
- ``ZapHandler``: pyzmq's own ZAP authenticator (``zmq.auth.thread.ThreadAuthenticator``, a
  thread), answering from an ``AllowList``; denials are logged, rate-limited.

- ``NngTls``: what a broker's NNG endpoints (``nng+tls+tcp://``, memo01) need instead, since
  CURVE is ZeroMQ's: the broker's certificate and key, and the client and worker certificates it
  admits (NNG's TLS transport, client certificates required); ``reload()`` re-reads them.

Every runtime takes these: ``serve_broker(curve=...)`` (``domo.trio``, ``domo.asyncio``),
``Client(curve=...)`` and ``run_worker(curve=...)`` (``domo.trio``, ``domo.asyncio``,
``domo.sync``); the ``domo`` command through ``--curve-*`` options and ``domo keygen``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import zmq
import zmq.auth
import zmq.auth.thread
from zmq.utils import z85

from domo.eventlog import ViolationLimiter
from domo.protocol.errors import DomoError

__all__ = [
    "AllowList",
    "CurveClient",
    "CurveError",
    "CurveServer",
    "KeyPair",
    "NngTls",
    "ZapHandler",
    "load_keypair",
    "load_public_key",
    "write_keypair",
]

logger = logging.getLogger("domo.curve")

KEY_LENGTH: Final = 40  # a 32-byte key in Z85


class CurveError(DomoError):
    """A key or allow-list file is missing, unreadable or malformed; or CURVE is unavailable."""


def _check_key(text: bytes, where: str) -> bytes:
    """``text`` if it is a Z85-encoded 32-byte key, else CurveError saying ``where``."""
    if len(text) != KEY_LENGTH:
        raise CurveError(f"{where}: a key is {KEY_LENGTH} Z85 characters, got {len(text)}")
    try:
        z85.decode(text)
    except (ValueError, KeyError, UnicodeDecodeError) as error:
        raise CurveError(f"{where}: not a Z85 key ({error})") from None
    return text


def _require_curve() -> None:
    if not zmq.has("curve"):
        raise CurveError("this libzmq was built without CURVE support")


@dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair, both keys Z85-encoded (40 ASCII characters each)."""

    public: bytes
    secret: bytes

    def __repr__(self) -> str:  # never print a secret key by accident
        return f"KeyPair(public={self.public.decode()!r}, secret=...)"


def write_keypair(directory: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """Create ``NAME.key`` (public) and ``NAME.key_secret`` (both keys, mode 0600) in
    ``directory``; returns their paths. Refuses to overwrite an existing file."""
    _require_curve()
    if not name or os.sep in name or name in (".", ".."):
        raise CurveError(f"a key name is a plain file name, got {name!r}")
    base = Path(directory) / name
    public_file = base.with_name(base.name + ".key")
    secret_file = base.with_name(base.name + ".key_secret")
    created: list[Path] = []
    try:
        # Created here, exclusively and with their final modes, before pyzmq writes them: the
        # secret key is never readable by others, not even for a moment, and nothing is
        # overwritten.
        for path, mode in ((public_file, 0o644), (secret_file, 0o600)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            os.close(fd)
            created.append(path)
        os.chmod(secret_file, 0o600)  # whatever the umask
        zmq.auth.create_certificates(str(directory), name)
    except FileExistsError as error:
        for path in created:
            path.unlink()
        raise CurveError(f"{error.filename} exists; not overwritten") from None
    except OSError as error:
        for path in created:
            path.unlink(missing_ok=True)
        raise CurveError(f"cannot write keys in {directory}: {error.strerror}") from None
    return public_file, secret_file


def load_keypair(path: str | os.PathLike[str]) -> KeyPair:
    """The key pair in a secret key file (``NAME.key_secret``, as ``write_keypair`` makes).

    A file that others may read is used, with a warning: the secret key is what lets a peer
    speak as this one.
    """
    _require_curve()
    try:
        public, secret = zmq.auth.load_certificate(path)
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as error:
        raise CurveError(f"cannot read the key file {os.fspath(path)}: {error}") from None
    if secret is None:
        raise CurveError(f"{os.fspath(path)} holds no secret key (a .key_secret file is needed)")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        logger.warning(
            "secret key file %s can be read by others (mode %o): chmod 600 it",
            os.fspath(path),
            stat.S_IMODE(mode),
        )
    where = os.fspath(path)
    return KeyPair(_check_key(public, where), _check_key(secret, where))


def load_public_key(text_or_path: str) -> bytes:
    """A public key given as its 40 Z85 characters, or as the path of a key file."""
    if len(text_or_path) == KEY_LENGTH and not os.path.exists(text_or_path):
        return _check_key(text_or_path.encode("ascii", "replace"), "the key")
    try:
        public, _ = zmq.auth.load_certificate(text_or_path)
    except (OSError, ValueError) as error:
        raise CurveError(
            f"{text_or_path!r} is neither a {KEY_LENGTH}-character Z85 key nor a readable key "
            f"file: {error}"
        ) from None
    return _check_key(public, text_or_path)


class AllowList:
    """The public keys a broker admits, read from a text file.

    One Z85 key (40 characters) per line; anything after the key on its line, blank lines and
    lines starting with ``#`` are comments (a name, say). ``domo keygen`` prints a line to paste.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._keys: frozenset[bytes] = self._read()
        self._lock = threading.Lock()  # reload may run in any thread; readers need none

    def __contains__(self, key: object) -> bool:
        return key in self._keys  # one reference read: a reload swaps the whole set

    def __len__(self) -> int:
        return len(self._keys)

    def reload(self) -> bool:
        """Re-read the file; on an error keep the current list, log why and return False."""
        with self._lock:
            try:
                keys = self._read()
            except CurveError as error:
                logger.error("allow-list not reloaded, the previous one stays: %s", error)
                return False
            self._keys = keys
        logger.info("allow-list reloaded from %s: %d key(s)", self.path, len(keys))
        return True

    def _read(self) -> frozenset[bytes]:
        try:
            lines = self.path.read_bytes().splitlines()
        except OSError as error:
            raise CurveError(f"cannot read the allow-list {self.path}: {error.strerror}") from None
        keys = set()
        for number, line in enumerate(lines, 1):
            words = line.split()
            if not words or words[0].startswith(b"#"):
                continue
            keys.add(_check_key(words[0], f"{self.path}, line {number}"))
        return frozenset(keys)


@dataclass(frozen=True)
class CurveServer:
    """A broker's CURVE settings: its key pair, and the keys it admits (None: any key)."""

    keys: KeyPair
    allow: AllowList | None

    def apply(self, socket: zmq.Socket[bytes]) -> None:
        """Make ``socket`` a CURVE server (before it binds)."""
        socket.curve_secretkey = self.keys.secret
        socket.curve_publickey = self.keys.public
        socket.curve_server = True
        socket.zap_domain = b"domo"


@dataclass(frozen=True)
class CurveClient:
    """A client's or worker's CURVE settings: the broker's public key and its own key pair."""

    server_key: bytes
    keys: KeyPair

    def apply(self, socket: zmq.Socket[bytes]) -> None:
        """Make ``socket`` a CURVE client of the broker (before it connects)."""
        socket.curve_serverkey = self.server_key
        socket.curve_publickey = self.keys.public
        socket.curve_secretkey = self.keys.secret


class _Admit:
    """The credentials provider pyzmq's authenticator calls with each client's key."""

    def __init__(self, allow: AllowList) -> None:
        self.allow = allow
        self.refused = ViolationLimiter(burst=5, window=10.0)  # one client retries every 0.1 s

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.allow:
            return True
        allowed, left_out = self.refused.admit("curve")
        if allowed:
            more = f" (and {left_out} more refusals left out of the log)" if left_out else ""
            logger.warning(
                "CURVE key %s is not on the allow-list: connection refused%s", key.decode(), more
            )
        return False


class ZapHandler:
    """Answers libzmq's ZAP requests for one context from an ``AllowList``; start before the
    broker binds, stop after its socket is closed and before the context is terminated."""

    def __init__(self, context: zmq.Context[Any], allow: AllowList) -> None:
        # A plain Context on the same libzmq context: the authenticator's thread makes its
        # socket from it, and the broker's may be a zmq.asyncio.Context.
        plain: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(context.underlying)
        self._authenticator = zmq.auth.thread.ThreadAuthenticator(
            plain, log=logging.getLogger("domo.curve.zap")
        )
        self._allow = allow

    def start(self) -> None:
        """Bind ``inproc://zeromq.zap.01`` in the context and answer from a thread."""
        self._authenticator.start()
        admit = _Admit(self._allow)
        self._authenticator.configure_curve_callback("domo", credentials_provider=admit)

    def stop(self) -> None:
        """Stop the thread and close its socket."""
        self._authenticator.stop()


_PEM_CERTIFICATE: Final = b"-----BEGIN CERTIFICATE-----"


class NngTls:
    """TLS for a broker's NNG endpoints (``nng+tls+tcp://``): its certificate and the peers it
    admits.

    ZeroMQ's CURVE does not reach NNG sockets, so a memo01 endpoint is authenticated by NNG's
    TLS transport instead, with client certificates required: ``cert_file`` holds the broker's
    certificate and its private key (PEM, one file), ``allow_file`` the certificates of the
    clients and workers it admits (PEM, one or more; a self-signed certificate admits its
    holder, a CA certificate everyone it signed). A peer without a certificate, or with one the
    file does not vouch for, fails the handshake: nothing it sends reaches the broker.

    ``reload()`` re-reads both files (``domo broker`` does so on SIGHUP) and tells the endpoints
    (``subscribe``), which re-open their listeners with them; a bad file keeps what is in force.
    """

    def __init__(
        self, cert_file: str | os.PathLike[str], allow_file: str | os.PathLike[str]
    ) -> None:
        self.cert_file = Path(cert_file)
        self.allow_file = Path(allow_file)
        self.allowed, self.certificates = self._read()
        self._listeners: list[Callable[[], bool]] = []

    def __len__(self) -> int:
        """How many certificates the allow-list holds."""
        return self.certificates

    def _read(self) -> tuple[str, int]:
        try:
            own = self.cert_file.read_bytes()
            allowed = self.allow_file.read_bytes()
        except OSError as error:
            raise CurveError(f"cannot read {error.filename}: {error.strerror}") from None
        if _PEM_CERTIFICATE not in own or b"PRIVATE KEY-----" not in own:
            raise CurveError(
                f"{self.cert_file}: the broker's certificate and its private key, both PEM, "
                "are needed in this one file"
            )
        count = allowed.count(_PEM_CERTIFICATE)
        if not count:
            raise CurveError(f"{self.allow_file}: no PEM certificate in the allow-list")
        if b"PRIVATE KEY-----" in allowed:
            raise CurveError(
                f"{self.allow_file} holds a private key: the allow-list takes the peers' "
                "certificates only (keep their keys with them)"
            )
        return allowed.decode("ascii", "replace"), count

    def subscribe(self, listener: Callable[[], bool]) -> None:
        """Call ``listener`` after each successful ``reload`` (an endpoint re-opening)."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[], bool]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def reload(self) -> bool:
        """Re-read both files; on an error keep the current ones, log why and return False."""
        try:
            allowed, count = self._read()
        except CurveError as error:
            logger.error("NNG TLS files not reloaded, the previous ones stay: %s", error)
            return False
        previous = self.allowed, self.certificates
        self.allowed, self.certificates = allowed, count
        if not all([listener() for listener in list(self._listeners)]):
            self.allowed, self.certificates = previous
            return False
        logger.info(
            "NNG TLS allow-list reloaded from %s: %d certificate(s)", self.allow_file, count
        )
        return True
