#include <cstdio>

#include "/work/wt-review38c/src_cpp/util/crc32c.cc"
int main() {
  for (uint64_t b : {128, 256, 384, 512, 768, 1024, 1536, 2048}) {
    __m128i k = adp::fold_constants(b);
    unsigned long long lo = _mm_cvtsi128_si64(k), hi = _mm_extract_epi64(k, 1);
    std::printf("%llu %016llx %016llx\n", (unsigned long long)b, lo, hi);
  }
}
