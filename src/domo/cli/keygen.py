"""``domo keygen``: write a CURVE key pair (``domo.curve``)."""

from __future__ import annotations

import argparse
import sys

from domo.curve import (
    CurveError,
    load_public_key,
    write_keypair,
)

from ._common import EXIT_OK, EXIT_USAGE, _subcommand


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = _subcommand(
        commands,
        "keygen",
        "write a CURVE key pair for a broker, worker or client",
        "Write a new CURVE key pair as NAME.key (the public key, to hand out) and "
        "NAME.key_secret (both keys, mode 0600, to keep) in --dir, in ZeroMQ's certificate "
        "format, and print the public key. A broker takes its NAME.key_secret with "
        "--curve-secret-file and lists the public keys it admits in --curve-allow-file; "
        "workers and clients take the broker's public key with --curve-server-key and their "
        "own NAME.key_secret with --curve-secret-file. Existing files are never overwritten.",
        _keygen,
        "warning",
    )
    sub.add_argument("name", metavar="NAME", help="the base name of the two key files")
    sub.add_argument(
        "--dir", default=".", metavar="DIR", help="where to write them (default: %(default)s)"
    )


async def _keygen(args: argparse.Namespace) -> int:
    try:
        public_file, secret_file = write_keypair(args.dir, args.name)
    except CurveError as error:
        print(f"domo keygen: {error}", file=sys.stderr)
        return EXIT_USAGE
    public = load_public_key(str(public_file)).decode()
    print(f"domo keygen: wrote {public_file} (public) and {secret_file} (secret, mode 0600)")
    print(f"public key: {public}")
    print(f"allow-list line: {public}  # {args.name}")
    return EXIT_OK
