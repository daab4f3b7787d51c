cd /work/wt-citime29
echo "== $(date -u +%H:%M:%S) uptime: $(uptime)"
/usr/bin/time -f "== sanitize.sh asan-python wall %e s, user %U, sys %S" bash scripts/sanitize.sh asan-python /tmp/citime29/t4 2>&1 | grep -E "sanitize.sh|bindings_driver: (parser|gateway|PASS)|== "
echo "== $(date -u +%H:%M:%S) uptime: $(uptime)"
ADP_ALLOW_STALE_NATIVE=1 /usr/bin/time -f "== test_dockerfile wall %e s" python -m pytest -q -p no:cacheprovider tests/packaging/test_dockerfile.py --durations=5 2>&1 | tail -9
echo "== $(date -u +%H:%M:%S) uptime: $(uptime)"
