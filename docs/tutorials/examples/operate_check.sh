# Is the broker up, and does a worker serve "echo"? Prints 200 (exit 0), or 404 (exit 6)
domo call mmi.service echo --timeout 1 --retries 0
# A worker, with the broker's heartbeat settings (here the defaults: 2.5 s, liveness 3)
domo worker echo --connect tcp://127.0.0.1:5555 --heartbeat-interval 2.5 --liveness 3
# Now a request goes through
domo call echo ping
