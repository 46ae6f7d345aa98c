"""A Spark driver for the cluster and Connect tests:
``python _driver.py URL ROWS ENDPOINT OUT [TRACES REPORT_OUT]``.

Joins the Spark at ``URL`` (``spark://...``: a standalone master; ``sc://...``: a Spark Connect
server), reads the Parquet file ``ROWS`` (columns ``id``, ``body``), sends every row through
``domo.spark.call_service`` to the service ``upper`` at the broker ``ENDPOINT`` and writes the
rows it gets back to the Parquet file ``OUT``. Given ``TRACES``, it first makes the report of
that trace directory on the same session (``domo.report.run``), its text on stdout and its
tables in ``REPORT_OUT``. Its own process: Spark keeps one session per process, and the test
process has its local one.
"""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.parquet as pq

from domo import report
from domo.spark import call_service, local_session, remote_session


def main() -> None:
    url, rows, endpoint, out = sys.argv[1:5]
    if url.startswith("sc://"):
        spark = remote_session(url, app_name="domo tests driver")
    else:
        spark = local_session(url, app_name="domo tests driver", driver_memory="1g")
    if len(sys.argv) > 6:
        # the session above: Spark keeps one per process, and the report joins it
        remote = url if url.startswith("sc://") else None
        master = None if remote else url
        code = report.run(sys.argv[5], out=sys.argv[6], master=master, remote=remote)
        if code != report.EXIT_OK:
            raise SystemExit(code)
    frame = spark.read.parquet(rows).repartition(4)
    result = call_service(frame, "upper", endpoint, window=8).toArrow()
    pq.write_table(pa.table(result), out)
    spark.stop()


if __name__ == "__main__":
    main()
