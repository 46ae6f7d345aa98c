domo broker --bind tcp://127.0.0.1:5555
