# terminal 3: wait for the reply (up to 60 s); --close tells Titanic to forget it then
domo fetch "$(cat request.id)" --connect tcp://127.0.0.1:5555 --wait 60 --close; echo "exit code: $?"
