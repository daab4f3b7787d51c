import sys, os, statistics
from lmcache_adp import CardStore
p = sys.argv[1]
if os.path.exists(p): os.unlink(p)
s = CardStore(p, 64 << 20); s.put("k", b"v"*5000); s.close()
w = []
for _ in range(9):
    s = CardStore(p, 64 << 20); w.append(s.stats()["recovery_seconds"]); s.close()
print(sys.argv[2], [round(x*1000,1) for x in w])
os.unlink(p)
