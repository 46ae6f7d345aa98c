# A broker for this machine's clients and workers, logging JSON to stderr, tracing to ./traces
domo broker --bind tcp://127.0.0.1:5555 --log-format json --trace-dir traces
