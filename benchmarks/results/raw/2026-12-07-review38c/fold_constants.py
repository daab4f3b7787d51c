# SPDX-License-Identifier: Apache-2.0
# review38c: the CRC32C fold constants derived apart from src_cpp/util/crc32c.cc (plain carry-less arithmetic on
# P = 0x11EDC6F41, bit-reflected), checked against the code's (code.txt: fold_constants(D) printed by a program
# that includes crc32c.cc), and a Python model of fold256_raw's order of folds checked against the bitwise CRC.
# Run from this folder: python3 fold_constants.py (prints "ok" for each distance and "bad 0").
# Independent: CRC32C poly P (normal form 0x11EDC6F41), x^e mod P by plain carry-less arithmetic, then bit-reflect
# into 32 bits, shifted left 32 (the code's layout). Low qword: x^(D+63) (multiplies H), high qword: x^(D-1).
P = 0x11EDC6F41
def xmod(e):
    r = 1
    for _ in range(e):
        r <<= 1
        if r >> 32 & 1: r ^= P
    return r
def refl32(v): return int(f"{v:032b}"[::-1], 2)
bad = 0
for line in open("code.txt"):
    b, lo, hi = line.split(); b = int(b)
    elo = refl32(xmod(b + 63)) << 32; ehi = refl32(xmod(b - 1)) << 32
    ok = (int(lo,16), int(hi,16)) == (elo, ehi)
    bad += not ok
    print(b, "ok" if ok else f"MISMATCH want {elo:016x} {ehi:016x}")
# And an independent fold model: fold a 256-bit ymm as the code does, checked against bitwise CRC32C.
import random
def clmul(a,b):
    r=0
    while b:
        if b&1: r^=a
        a<<=1;b>>=1
    return r
def crc_bitwise(crc, data):
    for c in data:
        crc ^= c
        for _ in range(8): crc = (crc>>1) ^ (0x82F63B78 if crc&1 else 0)
    return crc
ks = {int(l.split()[0]):(int(l.split()[1],16), int(l.split()[2],16)) for l in open("code.txt")}
def lane(bs): return int.from_bytes(bs,'little')
def fold128(a, k, nxt):
    alo, ahi = a & (2**64-1), a >> 64
    return clmul(alo, k[0]) ^ clmul(ahi, k[1]) ^ nxt
def model(crc, data):  # fold256_raw with 4 ymm = 8 lanes of 128 bits, then the tail to a 128-bit lane
    n=len(data); L=lambda at: lane(data[at:at+16])
    y=[[L(32*j), L(32*j+16)] for j in range(4)]; y[0][0]^=crc
    at=128
    while at+128<=n:
        for j in range(4): y[j]=[fold128(y[j][h], ks[1024], L(at+32*j+16*h)) for h in (0,1)]
        at+=128
    z=y[3]
    for j in (2,1,0): z=[fold128(y[j][h], ks[256*(3-j)], z[h]) for h in (0,1)]
    while at+32<=n: z=[fold128(z[h], ks[256], L(at+16*h)) for h in (0,1)]; at+=32
    x=fold128(z[0], ks[128], z[1])
    while at+16<=n: x=fold128(x, ks[128], L(at)); at+=16
    c=crc_bitwise(0, x.to_bytes(16,'little'))
    return crc_bitwise(c, data[at:])
random.seed(1)
for n in list(range(512, 700)) + [1000, 4096+77, 10000]:
    d=bytes(random.getrandbits(8) for _ in range(n)); init=random.getrandbits(32)
    if model(init, d) != crc_bitwise(init, d): bad+=1; print("model mismatch", n)
print("bad", bad)
