#!/bin/bash
# Metadata only (FIEMAP): where the card image's and fs_native's files lie on the disk, during the ABAB runs.
while true; do
  W=/var/tmp/diskqd/r
  if [ -f $W/card.img ]; then
    n=$(filefrag $W/card.img 2>/dev/null | awk '{print $2}')
    [ -n "$n" ] && [ "$n" != 0 ] && filefrag -v $W/card.img > /var/tmp/diskqd/frag/card-last.txt 2>&1
  fi
  if ls $W/fs_native/*.data >/dev/null 2>&1; then
    filefrag -v $W/fs_native/*.data > /var/tmp/diskqd/frag/fs-last.txt 2>&1
  elif [ -d $W/fs_native ]; then
    find $W/fs_native -type f | head -40 | xargs -r filefrag -v > /var/tmp/diskqd/frag/fs-last.txt 2>&1
  fi
  sleep 5
done
