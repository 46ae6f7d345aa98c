# terminal 4: at last, a worker for echo
domo worker echo --connect tcp://127.0.0.1:5555
