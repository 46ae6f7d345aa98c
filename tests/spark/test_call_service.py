"""``domo.spark.call_service`` on a real local Spark against a real broker and workers.

Every row goes through ``domo broker`` to ``_peer.py`` workers; a worker that refuses some rows
(its handler raises) gives those rows an error and the job still succeeds.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import broker, worker

pytestmark = [pytest.mark.spark, pytest.mark.io, pytest.mark.slow]


def test_every_row_gets_its_reply_or_its_error(spark: Any) -> None:
    from domo.spark import call_service

    bodies = [f"row-{index:05d}" for index in range(2000)]
    bodies[7] = "fail-7"
    bodies[1500] = "fail-1500"
    rows = [(index, body.encode()) for index, body in enumerate(bodies)]
    df = spark.createDataFrame(rows, "id long, body binary").repartition(3)
    with (
        broker() as endpoint,
        worker(endpoint, "upper", "upper"),
        worker(endpoint, "upper", "upper"),
    ):
        result = call_service(df, "upper", endpoint, window=8).collect()
    assert len(result) == 2000
    by_id = {row["id"]: row for row in result}
    for index, body in enumerate(bodies):
        row = by_id[index]
        assert row["body"] == body.encode()
        if body.startswith("fail"):
            assert row["reply"] is None
            assert row["error"].startswith("RemoteError: ")
        else:
            assert row["reply"] == body.upper().encode()
            assert row["error"] is None


def test_string_input_utf8_and_frames_decoding_and_nulls(spark: Any) -> None:
    from domo.spark import call_service

    df = spark.createDataFrame(
        [("héllo",), ("frames-two",), (None,), ("fail-now",)], "text string"
    ).coalesce(1)
    with broker() as endpoint, worker(endpoint, "upper", "upper"):
        text = call_service(
            df, "upper", endpoint, input_col="text", decode="utf-8", output_col="out"
        ).collect()
        frames = call_service(df, "upper", endpoint, input_col="text", decode="frames").collect()
    assert [(row["out"], row["error"]) for row in text[:2]] == [
        ("HéLLO", None),  # bytes.upper() leaves the é's UTF-8 bytes alone
        ("frames-two", None),  # answered in two frames "fra" + "mes-two", joined
    ]
    assert text[2]["out"] is None
    assert text[2]["error"] == "ValueError: text is null: nothing was sent"
    assert text[3]["error"].startswith("RemoteError: ")
    assert frames[1]["reply"] == [b"fra", b"mes-two"]
    assert frames[0]["reply"] == ["HéLLO".encode()]


def test_no_reply_in_time_is_the_rows_error(spark: Any) -> None:
    from domo.spark import call_service

    df = spark.createDataFrame([(b"a",), (b"b",)], "body binary").coalesce(1)
    with broker() as endpoint:  # no worker for the service: every request times out
        rows = call_service(df, "nobody", endpoint, timeout=0.5, retries=0).collect()
    assert [row["reply"] for row in rows] == [None, None]
    assert all(row["error"].startswith("RequestTimeout: ") for row in rows)


def test_bad_arguments_fail_before_any_job(spark: Any) -> None:
    from domo.spark import call_service

    df = spark.createDataFrame([(1, b"x")], "id long, body binary")
    with pytest.raises(TypeError, match="must be binary or string"):
        call_service(df, "s", "tcp://127.0.0.1:1", input_col="id")
    with pytest.raises(ValueError, match="no column"):
        call_service(df, "s", "tcp://127.0.0.1:1", input_col="missing")
    with pytest.raises(ValueError, match="already has a column"):
        call_service(df, "s", "tcp://127.0.0.1:1", output_col="id")
    with pytest.raises(ValueError, match="decode must be"):
        call_service(df, "s", "tcp://127.0.0.1:1", decode="latin-1")  # type: ignore[arg-type]
