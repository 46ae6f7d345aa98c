# is a worker serving "echo"? 200 (exit 0) or 404 (exit 6)
domo call mmi.service echo --timeout 1 --retries 0
# a worker, with the broker's heartbeat settings (the defaults)
domo worker echo --connect tcp://127.0.0.1:5555 --heartbeat-interval 2.5 --liveness 3
# a request through it
domo call echo ping
