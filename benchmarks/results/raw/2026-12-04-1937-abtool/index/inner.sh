#!/usr/bin/env bash
echo "uptime before: $(uptime)"
git log --oneline -1 | cut -c1-80
PYTHONPATH=. python benchmarks/bench_index.py --card /dev/shm/abtool-index.img --steps 10000,100000,1000000 2>&1 | grep -v " INFO: "
echo "uptime after: $(uptime)"
