#!/usr/bin/env bash
# Host discovery for examples/train_elastic.py on one machine: two names for this host, so
# that the worker on "127.0.0.1" can fail (Horovod elastic then blacklists that name) while
# the two on "localhost" go on.
echo "localhost:2"
echo "127.0.0.1:1"
