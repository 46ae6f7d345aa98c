# SIGTERM, as systemd, Docker and Kubernetes send it (Ctrl-C, SIGINT, is the same)
kill -TERM "$BROKER_PID"
