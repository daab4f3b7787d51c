import mmap, time, os, select
from lmcache.lmcache_fs import LMCacheFSClient
c = LMCacheFSClient("/var/tmp/probe27/fsn", 1, "", True, 0)
bufs = [mmap.mmap(-1, 2<<20) for _ in range(2)]
for b in bufs: b.write(b"x"*(2<<20))
def wait(n):
    got=0
    while got<n:
        select.select([c.event_fd()],[],[],5); got += len(c.drain_completions())
c.submit_batch_set(["m@1@0@abc0","m@1@0@abc1"], [memoryview(b) for b in bufs]); wait(1)
print("GETSTART", flush=True)
c.submit_batch_get(["m@1@0@abc0","m@1@0@abc1"], [memoryview(b) for b in bufs]); wait(1)
print("GETEND", flush=True)
c.close()
