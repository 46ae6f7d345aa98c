# terminal 1: a broker (Ctrl-C stops it; its workers are told DISCONNECT)
domo broker --bind tcp://127.0.0.1:5555
# terminal 2: a worker for the built-in echo service
domo worker echo --connect tcp://127.0.0.1:5555
# terminal 3: requests
domo call echo hello world     # prints "hello" and "world": one line per frame
domo call mmi.service echo     # prints 200: a worker serves echo
