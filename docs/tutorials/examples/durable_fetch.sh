# terminal 3: the reply was kept for you; --close tells Titanic to forget it
domo fetch "$(cat request.id)" --connect tcp://127.0.0.1:5555 --close; echo "exit code: $?"
