/* kvdisk: the disk tier of the prefix cache. One file per cached KV block,
 * named by its chain hash, so a restarted process finds the blocks of
 * prompts it served before.
 *
 * File format (little-endian), version 1:
 *   offset  size  field
 *        0     8  magic "LOOMKVB1"
 *        8     4  version (1)
 *       12     4  header size (64)
 *       16     4  block_size (tokens)
 *       20     4  n_layers
 *       24     4  kv_dim
 *       28     4  KV type (loom_kv_type: 0 f32, 1 f16, 2 bf16, 3 q8, 4 q4;
 *                  5 per layer from kv_config.json, whose contents are in
 *                  the namespace and so in every chain hash)
 *       32     8  chain hash of the block (the namespace is folded into it)
 *       40     8  chain hash before the block
 *       48     8  payload bytes
 *       56     8  XXH64 of everything after the header
 *       64   4*B  the block's token ids
 *  64+4*B      P  K then V, each layer after layer: block_size stored rows
 *                  of that layer's row bytes
 * Version 2 (written with a zstd level set, when it saves space): the same
 * header with version 2, the tokens, then the K/V payload as one zstd
 * frame that decompresses to exactly the payload bytes at offset 48; the
 * file is shorter than a version 1 file and the checksum covers what is
 * on disk after the header. Both versions are read whatever the level;
 * a loom built without zstd skips (keeps) version 2 files.
 * Recurrent-state snapshots live beside them, one file each
 * ("<hash>.lks"): the same 64-byte header with magic "LOOMKVS1", the
 * boundary's token count at offset 16, the state's bytes at 48 and the
 * XXH64 of the state at 56, then the state.
 * Files are written to a temporary name and renamed, so a reader never
 * sees a half-written file. A file that fails any check (magic, version,
 * geometry, size, hash, tokens, checksum) is reported, deleted and treated
 * as a miss. When the directory cannot be written, the tier turns itself
 * off and the cache stays in memory. */
#ifndef LOOM_KVDISK_H
#define LOOM_KVDISK_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kv.h"

typedef struct loom_kvdisk loom_kvdisk;

typedef struct loom_kvdisk_stats {
    uint64_t reads, writes, read_bytes, write_bytes, bad_files, evicted_files;
    size_t bytes;            /* on disk now */
    int disabled;            /* the tier gave up (unwritable directory, full disk) */
} loom_kvdisk_stats;

/* Opens (creating) dir for a pool of p's geometry, keeping at most cap
 * bytes (0 = unlimited), and attaches itself as p's tier. */
loom_status loom_kvdisk_open(const char *dir, size_t cap, loom_kv_pool *p, loom_kvdisk **out);
/* Detaches from the pool; call after loom_kv_cache_spill_all if wanted. */
void loom_kvdisk_close(loom_kvdisk *d, loom_kv_pool *p);
void loom_kvdisk_get_stats(const loom_kvdisk *d, loom_kvdisk_stats *s);
/* Reading block files off the engine thread. A reader owns the buffers
 * of one read at a time; loom_kvdisk_read touches only the reader, the
 * file and block b of p (which the caller must own alone), and the tier's
 * fixed geometry, so it may run on another thread while the engine thread
 * spills. Its result goes back through loom_kvdisk_account on the engine
 * thread (counts, index, reporting and deleting a damaged file). */
typedef struct loom_kvdisk_reader loom_kvdisk_reader;
enum { LOOM_KVDISK_OK, LOOM_KVDISK_MISS, LOOM_KVDISK_GONE, LOOM_KVDISK_BAD };
loom_status loom_kvdisk_reader_create(const loom_kvdisk *d, loom_kvdisk_reader **out);
void loom_kvdisk_reader_free(loom_kvdisk_reader *rd);
/* Whether a block file with this chain hash is indexed (no I/O). */
int loom_kvdisk_has(const loom_kvdisk *d, uint64_t hash);
/* Reads the block file hash into block b, checked against the chain hash
 * before it (parent) and the block's tokens. LOOM_KVDISK_OK, _MISS (not
 * this prefix's block, or unreadable by this build), _GONE (no file), or
 * _BAD with *why. *bytes: the file's size. */
int loom_kvdisk_read(const loom_kvdisk *d, loom_kvdisk_reader *rd, loom_kv_pool *p, uint64_t hash,
                     uint64_t parent, const int32_t *tokens, int b, const char **why, size_t *bytes);
void loom_kvdisk_account(loom_kvdisk *d, uint64_t hash, int result, const char *why, size_t bytes);

/* Compresses block files written from now on at this zstd level (1..19;
 * 0 = off). LOOM_ERR_UNSUPPORTED when built without zstd. */
loom_status loom_kvdisk_set_zstd(loom_kvdisk *d, int level);

/* Writes a state snapshot saved at a boundary of n_tokens (0 on success). */
int loom_kvdisk_put_state(loom_kvdisk *d, uint64_t hash, int n_tokens, const void *state,
                          size_t bytes);
/* Reads the snapshot with this hash into state (bytes long); 0 on success,
 * with *n_tokens set. Damaged files are reported and deleted. */
int loom_kvdisk_get_state(loom_kvdisk *d, uint64_t hash, int *n_tokens, void *state, size_t bytes);
/* The same in two halves, like loom_kvdisk_read and _account: whether a
 * state file is indexed (no I/O); reading it on any thread (no index or
 * counters touched); accounting the result on the engine thread. */
int loom_kvdisk_has_state(const loom_kvdisk *d, uint64_t hash);
int loom_kvdisk_read_state(const loom_kvdisk *d, uint64_t hash, int *n_tokens, void *state, size_t bytes,
                           const char **why);
void loom_kvdisk_account_state(loom_kvdisk *d, uint64_t hash, int result, const char *why, size_t bytes);

#endif
