#!/bin/bash
# How long fallocate(fd, 0, 0, N) of a new file takes (and its unlink), ext4 /var/tmp and tmpfs /dev/shm.
set -u
for dir in /var/tmp/prealloc-fio /dev/shm/prealloc-fio; do
  mkdir -p $dir
  for sz in $SIZES; do
    [ $dir = /dev/shm/prealloc-fio ] && [ $(numfmt --from=iec $sz) -gt $((8<<30)) ] && continue
    f=$dir/falloc-$sz; rm -f $f
    avail=$(df --output=avail -B1 $dir | tail -1)
    t0=$(date +%s.%N); fallocate -l $sz $f; rc=$?; t1=$(date +%s.%N)
    blocks=$(stat -c %b $f 2>/dev/null)
    t2=$(date +%s.%N); rm -f $f; t3=$(date +%s.%N)
    printf "%s %s: fallocate rc=%d %.3f s, st_blocks*512=%s, unlink %.3f s (avail before %s) load %s\n" $dir $sz $rc \
      $(echo "$t1-$t0"|bc) "$((${blocks:-0}*512))" $(echo "$t3-$t2"|bc) $avail "$(cut -d' ' -f1-3 /proc/loadavg)"
  done
  # the sparse way, for comparison
  f=$dir/trunc; t0=$(date +%s.%N); truncate -s 8G $f; t1=$(date +%s.%N); rm -f $f
  printf "%s 8G: ftruncate %.4f s\n" $dir $(echo "$t1-$t0"|bc)
  rmdir $dir 2>/dev/null
done
