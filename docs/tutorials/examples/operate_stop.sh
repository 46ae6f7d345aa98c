# SIGTERM (what systemd, Docker and Kubernetes send) or SIGINT (Ctrl-C): a graceful stop
kill -TERM "$BROKER_PID"
