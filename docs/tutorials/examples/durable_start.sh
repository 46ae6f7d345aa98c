# terminal 1: a broker
domo broker --bind tcp://127.0.0.1:5555
# terminal 2: Titanic, keeping its requests in titanic.db
domo titanic --connect tcp://127.0.0.1:5555 --db titanic.db
