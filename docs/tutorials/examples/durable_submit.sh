# terminal 3: store a request for "echo", which has no worker yet; keep its id
domo submit echo "hello, later" --connect tcp://127.0.0.1:5555 | tee request.id
domo fetch "$(cat request.id)" --connect tcp://127.0.0.1:5555; echo "exit code: $?"
