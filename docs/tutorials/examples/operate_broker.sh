# JSON logs on stderr, a trace record per request in ./traces
domo broker --bind tcp://127.0.0.1:5555 --log-format json --trace-dir traces
