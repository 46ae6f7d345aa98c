"""A Spark driver for the cluster and Connect tests: ``python _driver.py URL ROWS ENDPOINT OUT``.

Joins the Spark at ``URL`` (``spark://...``: a standalone master; ``sc://...``: a Spark Connect
server), reads the Parquet file ``ROWS`` (columns ``id``, ``body``), sends every row through
``domo.spark.call_service`` to the service ``upper`` at the broker ``ENDPOINT`` and writes the
rows it gets back to the Parquet file ``OUT``. Its own process: Spark keeps one session per
process, and the test process has its local one.
"""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.parquet as pq

from domo.spark import call_service, local_session, remote_session


def main() -> None:
    url, rows, endpoint, out = sys.argv[1:5]
    if url.startswith("sc://"):
        spark = remote_session(url, app_name="domo tests driver")
    else:
        spark = local_session(url, app_name="domo tests driver", driver_memory="1g")
    frame = spark.read.parquet(rows).repartition(4)
    result = call_service(frame, "upper", endpoint, window=8).toArrow()
    pq.write_table(pa.table(result), out)
    spark.stop()


if __name__ == "__main__":
    main()
