/* Stand-in for <xxhash.h> used only by tools/cuda_check.sh when the
 * library's packages are not installed on the GPU machine: the CUDA kernel
 * tests link src/engine/kv.c for its paged layout and row codec, never its
 * prefix-cache hashes, so FNV-1a is enough here. Not for the real build. */
#ifndef LOOM_TEST_XXHASH_SHIM_H
#define LOOM_TEST_XXHASH_SHIM_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t XXH3_64bits_withSeed(const void *p, size_t n, uint64_t seed) {
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 0xcbf29ce484222325ull ^ seed;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static inline uint64_t XXH3_64bits(const void *p, size_t n) {
    return XXH3_64bits_withSeed(p, n, 0);
}

#endif
