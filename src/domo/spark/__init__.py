"""Spark for domo: call a broker's service once per row of a DataFrame, and a local session.

``call_service(df, service, endpoint)`` returns ``df`` with two more columns: each row's reply
and, for a row whose request failed (the worker's handler raised, no reply in time, a reply that
cannot be decoded), its error instead. One failed row never fails the job.

How it runs: ``DataFrame.mapInArrow`` hands each partition's rows to a Python function on an
executor, in Arrow batches. The function opens one ``domo.sync.Client`` per partition with a
pool of ``window`` sessions (MDP/0.2 has no request id, so each request in flight needs its own
session and socket, MDP-C-07) and keeps up to ``window`` requests in flight from a thread pool of
the same size, in row order. Nothing is made on the driver but the plan: the ZeroMQ context and
sockets live in the executor's Python worker, so any master works whose executors reach
``endpoint`` and have domo installed (``pip install 'domo[spark]'``).

Spark may run a task again (a lost executor, speculation): a row can then be sent twice. Serve
only idempotent services this way, or deduplicate by a key inside the body.

``local_session()`` starts the quiet, fast local session ``domo report`` and the tests use (or
joins a standalone cluster: ``local_session("spark://host:7077")``); ``remote_session(url)``
connects to a Spark Connect server (``sc://host:15002``) with no JVM in this process.
Everything here needs the ``spark`` extra; importing this module does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, Literal

from ._session import (
    CONNECT_HINT,
    INSTALL_HINT,
    JAVA_HINT,
    SparkUnavailable,
    java_command,
    local_session,
    remote_session,
)

__all__ = [
    "CONNECT_HINT",
    "INSTALL_HINT",
    "JAVA_HINT",
    "ReplyDecoding",
    "SparkUnavailable",
    "call_service",
    "java_command",
    "local_session",
    "remote_session",
]

ReplyDecoding = Literal["binary", "utf-8", "frames"]
DECODINGS: Final = ("binary", "utf-8", "frames")


def _decoder(decode: ReplyDecoding) -> Callable[[list[bytes]], Any]:
    if decode == "binary":
        return b"".join
    if decode == "utf-8":
        return lambda frames: b"".join(frames).decode("utf-8")  # strict: a bad reply is an error
    return list


def call_service(
    df: Any,
    service: str,
    endpoint: str,
    *,
    input_col: str = "body",
    output_col: str = "reply",
    error_col: str = "error",
    decode: ReplyDecoding = "binary",
    window: int = 16,
    timeout: float = 10.0,
    retries: int = 0,
) -> Any:
    """``df`` with each row's reply from ``service`` (at the broker ``endpoint``) added.

    - ``input_col``: the request body, one frame. Its column must be ``binary`` (sent as is) or
      ``string`` (sent UTF-8 encoded). A null is not sent: its row gets an error.
    - ``output_col`` (default ``reply``): the FINAL's body, decoded by ``decode``: ``"binary"``
      (the frames joined, a ``binary`` column), ``"utf-8"`` (joined and decoded strictly, a
      ``string`` column; a reply that is not UTF-8 is that row's error) or ``"frames"`` (an
      ``array<binary>``, one element per frame). Null where the row failed.
    - ``error_col`` (default ``error``, ``string``): null where the row succeeded, else the
      exception's type and message, e.g. ``RemoteError: ...`` (the worker's handler raised) or
      ``RequestTimeout: ...`` (no reply after ``timeout`` seconds and ``retries`` resends).
    - ``window``: requests in flight per partition (sessions in its client's pool).

    The result is lazy, like any DataFrame: requests go out when an action runs, once per action
    (cache the result to reuse it).
    """
    from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType

    if decode not in DECODINGS:
        raise ValueError(f"decode must be one of {', '.join(DECODINGS)}, got {decode!r}")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if input_col not in df.columns:
        raise ValueError(f"no column {input_col!r} in the DataFrame (it has {df.columns})")
    for name in (output_col, error_col):
        if name in df.columns:
            raise ValueError(f"the DataFrame already has a column {name!r}")
    input_type = df.schema[input_col].dataType
    if not isinstance(input_type, BinaryType | StringType):
        raise TypeError(
            f"column {input_col!r} must be binary or string, not {input_type.simpleString()}"
        )
    reply_type = {
        "binary": BinaryType(),
        "utf-8": StringType(),
        "frames": ArrayType(BinaryType(), containsNull=False),
    }[decode]
    schema = StructType(
        [
            *df.schema.fields,
            StructField(output_col, reply_type, nullable=True),
            StructField(error_col, StringType(), nullable=True),
        ]
    )
    encode_text = isinstance(input_type, StringType)
    run = _partition_caller(
        service,
        endpoint,
        (input_col, output_col, error_col),
        decode,
        encode_text,
        window,
        timeout,
        retries,
    )
    return df.mapInArrow(run, schema)


def _partition_caller(
    service: str,
    endpoint: str,
    columns: tuple[str, str, str],
    decode: ReplyDecoding,
    encode_text: bool,
    window: int,
    timeout: float,
    retries: int,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function Spark runs per partition; it closes over plain values only (it is pickled)."""
    input_col, output_col, error_col = columns

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from domo.sync import Client

        reply_type = {"binary": pa.binary(), "utf-8": pa.string(), "frames": pa.list_(pa.binary())}
        decoded = _decoder(decode)

        with (
            Client(endpoint, timeout=timeout, retries=retries, concurrency=window) as client,
            ThreadPoolExecutor(max_workers=window, thread_name_prefix="domo-call") as pool,
        ):

            def one(value: Any) -> tuple[Any, str | None]:
                if value is None:
                    return None, f"ValueError: {input_col} is null: nothing was sent"
                body = value.encode("utf-8") if encode_text else value
                try:
                    return decoded(client.request(service, body)), None
                except Exception as error:  # every failure is this row's, not the job's
                    return None, f"{type(error).__name__}: {error}"

            for batch in batches:
                values = batch.column(batch.schema.get_field_index(input_col)).to_pylist()
                results = list(pool.map(one, values))
                replies = pa.array([reply for reply, _ in results], type=reply_type[decode])
                errors = pa.array([error for _, error in results], type=pa.string())
                yield pa.RecordBatch.from_arrays(
                    [*batch.columns, replies, errors],
                    names=[*batch.schema.names, output_col, error_col],
                )

    return run
