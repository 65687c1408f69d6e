/* Stand-in for <xxhash.h> used only by tools/cuda_check.sh when the
 * library's packages are not installed on the GPU machine: the CUDA kernel
 * tests link src/engine/kv.c for its paged layout and row codec, and the
 * engine test the scheduler, whose prefix-cache hashes only need to agree
 * within one process, so FNV-1a is enough here. Not for the real build. */
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

/* the disk tier's file checksums (the engine test links it, never uses it) */
static inline uint64_t XXH64(const void *p, size_t n, uint64_t seed) {
    return XXH3_64bits_withSeed(p, n, seed);
}

#endif
