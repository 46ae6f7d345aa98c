"""Read a broker's traces: one line per request, then one per worker change.

``python operate_traces.py traces`` (the broker's ``--trace-dir``); needs pyarrow.
"""

import sys
from pathlib import Path

import pyarrow.parquet as pq

directory = Path(sys.argv[1] if len(sys.argv) > 1 else "traces")
for path in sorted(directory.glob("requests-*.parquet")):
    for r in pq.read_table(path).to_pylist():
        total_ms = (r["finished"] - r["received"]) * 1000
        queued = f"{r['queue_waits'][0] * 1000:.1f} ms" if r["queue_waits"] else "-"
        print(
            f"request {r['request_id']} {r['service']!r}: {r['outcome']} in {total_ms:.1f} ms"
            f" (queued {queued}, {len(r['dispatches'])} dispatch(es), {r['request_size']} bytes in)"
        )
for path in sorted(directory.glob("workers-*.parquet")):
    for w in pq.read_table(path).to_pylist():
        why = f" ({w['reason']})" if w["reason"] else ""
        print(f"worker {w['worker'].hex()} {w['service']!r}: {w['change']}{why}")
