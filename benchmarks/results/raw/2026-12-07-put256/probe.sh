#!/bin/bash
# put256 probe: drive.py's timed stores (2 workers, 2 keys a worker, 4 batches in flight) traced with `perf trace -s`
# (syscall counts and times by thread, attached after the warm-up, ended after the stores) and then, in a second run,
# sampled with `perf record -g`. Args: DIR DURABLE REPS SIZE_MB TAG. Run under flock by the caller.
cd /work/wt-put256
D=benchmarks/results/raw/2026-12-07-put256
dir=$1; dur=$2; reps=$3; mb=$4; tag=$5
echo "== trace $tag $(uptime | sed 's/.*load/load/')"
coproc DRV { PAUSE=3 python $D/drive.py $dir $dur $reps $mb 2>&1; }
while read -r line <&${DRV[0]}; do echo "$line"; case "$line" in ready*) break;; esac; done
pid=$(echo $line | awk '{print $2}')
if [ "$MODE" = record ]; then perf record -q -g -p $pid -o /var/tmp/put256-perf-$tag.data &>/dev/null & else perf trace -s -p $pid -o $D/trace-$tag.txt & fi
tp=$!
while read -r line <&${DRV[0]}; do echo "$line"; [ "$line" = done ] && break; done
kill -INT $tp; wait $tp
cat <&${DRV[0]}
wait
echo "== end trace $tag $(uptime | sed 's/.*load/load/')"
