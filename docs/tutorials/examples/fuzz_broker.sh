# terminal 1: the broker under test, with a short heartbeat so that scenarios stay short
domo broker --bind tcp://127.0.0.1:5555 --heartbeat-interval 0.2 --liveness 3
# terminal 2: generated clients and workers against it, for at most 20 seconds (seed 1)
domo fuzz tcp://127.0.0.1:5555 --heartbeat-interval 0.2 --liveness 3 --examples 5 --time-budget 20 --seed 1
