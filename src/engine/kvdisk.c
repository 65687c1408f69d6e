/* kvdisk: block files with checksums, an in-memory index for the byte cap. */
#include "engine/kvdisk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#ifdef LOOM_ZSTD
#include <zstd.h>
#endif

#include "base/base.h"

#define KVD_MAGIC "LOOMKVB1"
#define KVD_VERSION 1u
#define KVD_VERSION_ZSTD 2u /* the K/V payload is one zstd frame */
#define KVD_HEADER 64u
#define KVD_EXT ".lkv"
#define KVD_MIXED 5u /* KV type code of a pool with per-layer types */
#define KVS_MAGIC "LOOMKVS1"
#define KVS_EXT ".lks"

typedef struct kvd_entry {
    uint64_t hash;
    size_t size;
    uint64_t age;          /* larger = newer */
    int state;             /* a state snapshot (.lks), not a block */
} kvd_entry;

struct loom_kvdisk {
    char *dir;             /* owned */
    size_t cap;
    kvd_entry *entries;    /* owned [n], unordered */
    int n, n_cap;
    uint64_t clock;
    uint8_t *buf;          /* owned: one file's bytes */
    size_t file_size, payload; /* of an uncompressed block file */
    int zstd_level;        /* compress written block files; 0 = off */
    uint8_t *zbuf;         /* owned [zbuf_cap]: a compressed payload */
    size_t zbuf_cap;
    struct loom_kvdisk_reader *rd; /* owned: the synchronous fetch's buffers */
    int block_size, n_layers, kv_dim, dtype_code;
    loom_kvdisk_stats st;
};

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void file_name_kind(const loom_kvdisk *d, uint64_t hash, int state, char *buf, size_t n) {
    snprintf(buf, n, "%s/%016llx%s", d->dir, (unsigned long long)hash, state ? KVS_EXT : KVD_EXT);
}
static void file_name(const loom_kvdisk *d, uint64_t hash, char *buf, size_t n) {
    file_name_kind(d, hash, 0, buf, n);
}

static int find_entry_kind(const loom_kvdisk *d, uint64_t hash, int state) {
    for (int i = 0; i < d->n; i++)
        if (d->entries[i].hash == hash && d->entries[i].state == state) return i;
    return -1;
}
static int find_entry(const loom_kvdisk *d, uint64_t hash) { return find_entry_kind(d, hash, 0); }

static void drop_entry(loom_kvdisk *d, int i) {
    d->st.bytes -= d->entries[i].size;
    d->entries[i] = d->entries[--d->n];
}

static void remove_file_kind(loom_kvdisk *d, uint64_t hash, int state) {
    char path[4096];
    file_name_kind(d, hash, state, path, sizeof path);
    unlink(path);
    int i = find_entry_kind(d, hash, state);
    if (i >= 0) drop_entry(d, i);
}
static void remove_file(loom_kvdisk *d, uint64_t hash) { remove_file_kind(d, hash, 0); }

static void add_entry_kind(loom_kvdisk *d, uint64_t hash, size_t size, int state) {
    int i = find_entry_kind(d, hash, state);
    if (i >= 0) {
        d->entries[i].age = ++d->clock;
        return;
    }
    if (d->n == d->n_cap) {
        int cap = d->n_cap ? d->n_cap * 2 : 64;
        kvd_entry *ne = realloc(d->entries, sizeof *ne * (size_t)cap);
        if (!ne) return; /* the file stays; it is just not counted */
        d->entries = ne;
        d->n_cap = cap;
    }
    d->entries[d->n++] = (kvd_entry){hash, size, ++d->clock, state};
    d->st.bytes += size;
}
static void add_entry(loom_kvdisk *d, uint64_t hash, size_t size) { add_entry_kind(d, hash, size, 0); }

/* Deletes the oldest files until the cap holds. */
static void enforce_cap(loom_kvdisk *d) {
    while (d->cap && d->st.bytes > d->cap && d->n > 0) {
        int old = 0;
        for (int i = 1; i < d->n; i++)
            if (d->entries[i].age < d->entries[old].age) old = i;
        remove_file_kind(d, d->entries[old].hash, d->entries[old].state);
        d->st.evicted_files++;
    }
}

static void disable(loom_kvdisk *d, const char *why) {
    if (!d->st.disabled)
        loom_log(LOOM_LOG_WARN, "prefix cache disk tier %s: %s; continuing in memory only", d->dir, why);
    d->st.disabled = 1;
}

static void spill(void *ctx, const loom_kv_pool *p, int b) {
    loom_kvdisk *d = ctx;
    if (d->st.disabled || !p->hash[b]) return;
    uint64_t hash = p->hash[b];
    if (find_entry(d, hash) >= 0) {
        add_entry(d, hash, d->file_size); /* refresh its age */
        return;
    }
    uint8_t *h = d->buf;
    memset(h, 0, KVD_HEADER);
    memcpy(h, KVD_MAGIC, 8);
    put32(h + 8, KVD_VERSION);
    put32(h + 12, KVD_HEADER);
    put32(h + 16, (uint32_t)p->lay.block_size);
    put32(h + 20, (uint32_t)p->lay.n_layers);
    put32(h + 24, (uint32_t)p->lay.kv_dim);
    put32(h + 28, (uint32_t)d->dtype_code);
    put64(h + 32, hash);
    put64(h + 40, p->bparent[b]);
    put64(h + 48, d->payload);
    uint8_t *body = h + KVD_HEADER;
    size_t tok_bytes = sizeof(int32_t) * (size_t)p->lay.block_size;
    memcpy(body, p->btok + (size_t)b * p->lay.block_size, tok_bytes);
    uint8_t *k = body + tok_bytes, *v = k + d->payload / 2;
    for (int l = 0; l < p->lay.n_layers; l++) {
        size_t rows = p->lay.layer[l].row_bytes * (size_t)p->lay.block_size;
        memcpy(k, loom_kv_block_k(&p->lay, l, b), rows);
        memcpy(v, loom_kv_block_v(&p->lay, l, b), rows);
        k += rows;
        v += rows;
    }
    size_t size = d->file_size;
#ifdef LOOM_ZSTD
    if (d->zstd_level > 0) { /* kept only when it saves space */
        size_t z = ZSTD_compress(d->zbuf, d->zbuf_cap, body + tok_bytes, d->payload, d->zstd_level);
        if (!ZSTD_isError(z) && z < d->payload) {
            memcpy(body + tok_bytes, d->zbuf, z);
            size = KVD_HEADER + tok_bytes + z;
            put32(h + 8, KVD_VERSION_ZSTD);
        }
    }
#endif
    put64(h + 56, XXH64(body, size - KVD_HEADER, 0));
    char path[4096], tmp[4200];
    file_name(d, hash, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        disable(d, strerror(errno));
        return;
    }
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, d->buf + off, size - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    int ok = off == size;
    int err = errno;
    ok = (close(fd) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        disable(d, ok ? strerror(errno) : strerror(err));
        return;
    }
    d->st.writes++;
    d->st.write_bytes += size;
    add_entry(d, hash, size);
    enforce_cap(d);
}

static int bad_file(loom_kvdisk *d, uint64_t hash, const char *why) {
    char path[4096];
    file_name(d, hash, path, sizeof path);
    loom_log(LOOM_LOG_WARN, "prefix cache file %s: %s; deleted", path, why);
    d->st.bad_files++;
    remove_file(d, hash);
    return -1;
}

struct loom_kvdisk_reader {
    uint8_t *buf;          /* owned [file_size + 1]: one file's bytes */
    uint8_t *zbuf;         /* owned [zcap]: a decompressed payload, or NULL */
    size_t zcap;
};

loom_status loom_kvdisk_reader_create(const loom_kvdisk *d, loom_kvdisk_reader **out) {
    *out = NULL;
    loom_kvdisk_reader *rd = calloc(1, sizeof *rd);
    if (!rd) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    rd->buf = malloc(d->file_size + 1);
#ifdef LOOM_ZSTD
    rd->zcap = d->payload;
    rd->zbuf = malloc(rd->zcap);
    if (!rd->zbuf) rd->buf = (free(rd->buf), NULL);
#endif
    if (!rd->buf) {
        free(rd);
        return loom_err(LOOM_ERR_NOMEM, "out of memory");
    }
    *out = rd;
    return LOOM_OK;
}

void loom_kvdisk_reader_free(loom_kvdisk_reader *rd) {
    if (!rd) return;
    free(rd->buf);
    free(rd->zbuf);
    free(rd);
}

int loom_kvdisk_has(const loom_kvdisk *d, uint64_t hash) { return find_entry(d, hash) >= 0; }

int loom_kvdisk_read(const loom_kvdisk *d, loom_kvdisk_reader *rd, loom_kv_pool *p, uint64_t hash,
                     uint64_t parent, const int32_t *tokens, int b, const char **why, size_t *bytes) {
    *why = NULL;
    *bytes = 0;
    char path[4096];
    file_name(d, hash, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return LOOM_KVDISK_GONE;
    size_t off = 0;
    for (;;) {
        ssize_t r = read(fd, rd->buf + off, d->file_size - off);
        if (r <= 0) break;
        off += (size_t)r;
        if (off == d->file_size) {
            char extra;
            if (read(fd, &extra, 1) > 0) off++; /* longer than it should be */
            break;
        }
    }
    close(fd);
    *bytes = off;
    const uint8_t *h = rd->buf;
    size_t tok_bytes = sizeof(int32_t) * (size_t)p->lay.block_size;
    /* a compressed file is shorter, never longer */
    int zstd = off >= KVD_HEADER && get32(h + 8) == KVD_VERSION_ZSTD;
#define BAD(text) return (*why = (text), LOOM_KVDISK_BAD)
    if (zstd ? off <= KVD_HEADER + tok_bytes || off >= d->file_size : off != d->file_size)
        BAD("wrong size (truncated or foreign)");
    if (memcmp(h, KVD_MAGIC, 8) != 0) BAD("bad magic");
#ifndef LOOM_ZSTD
    if (zstd) return LOOM_KVDISK_MISS; /* written by a loom with zstd: not corrupt, unreadable here */
#endif
    if (get32(h + 8) != KVD_VERSION && !zstd) BAD("unsupported version");
    if (get32(h + 12) != KVD_HEADER || get32(h + 16) != (uint32_t)p->lay.block_size ||
        get32(h + 20) != (uint32_t)p->lay.n_layers || get32(h + 24) != (uint32_t)p->lay.kv_dim ||
        get32(h + 28) != (uint32_t)d->dtype_code || get64(h + 48) != d->payload)
        BAD("KV geometry differs from this model's");
    if (get64(h + 32) != hash) BAD("hash does not match the file name");
    if (XXH64(h + KVD_HEADER, off - KVD_HEADER, 0) != get64(h + 56)) BAD("checksum mismatch");
    /* A hash collision or another prefix: not ours, but not corrupt either. */
    if (get64(h + 40) != parent || memcmp(h + KVD_HEADER, tokens, tok_bytes) != 0) return LOOM_KVDISK_MISS;
    const uint8_t *k = h + KVD_HEADER + tok_bytes;
#ifdef LOOM_ZSTD
    if (zstd) {
        size_t z = ZSTD_decompress(rd->zbuf, rd->zcap, k, off - KVD_HEADER - tok_bytes);
        if (ZSTD_isError(z) || z != d->payload) BAD("the zstd payload does not decompress to the block");
        k = rd->zbuf;
    }
#endif
#undef BAD
    const uint8_t *v = k + d->payload / 2;
    for (int l = 0; l < p->lay.n_layers; l++) {
        size_t rows = p->lay.layer[l].row_bytes * (size_t)p->lay.block_size;
        memcpy(loom_kv_block_k(&p->lay, l, b), k, rows);
        memcpy(loom_kv_block_v(&p->lay, l, b), v, rows);
        k += rows;
        v += rows;
    }
    return LOOM_KVDISK_OK;
}

void loom_kvdisk_account(loom_kvdisk *d, uint64_t hash, int result, const char *why, size_t bytes) {
    int i;
    switch (result) {
    case LOOM_KVDISK_OK:
        d->st.reads++;
        d->st.read_bytes += bytes;
        add_entry(d, hash, bytes);
        break;
    case LOOM_KVDISK_GONE: /* deleted under us (the byte cap) */
        if ((i = find_entry(d, hash)) >= 0) drop_entry(d, i);
        break;
    case LOOM_KVDISK_BAD:
        bad_file(d, hash, why);
        break;
    default:
        break;
    }
}

/* The tier's synchronous fetch (loom_kv_tier): read and account at once. */
static int fetch(void *ctx, loom_kv_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens,
                 int b) {
    loom_kvdisk *d = ctx;
    if (find_entry(d, hash) < 0 || !d->rd) return -1;
    const char *why;
    size_t bytes;
    int r = loom_kvdisk_read(d, d->rd, p, hash, parent, tokens, b, &why, &bytes);
    loom_kvdisk_account(d, hash, r, why, bytes);
    return r == LOOM_KVDISK_OK ? 0 : -1;
}

/* Indexes existing block files; temporary leftovers are removed. */
static void scan(loom_kvdisk *d) {
    DIR *dir = opendir(d->dir);
    if (!dir) return;
    struct dirent *e;
    while ((e = readdir(dir))) {
        const char *n = e->d_name;
        size_t len = strlen(n);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", d->dir, n);
        if (strstr(n, KVD_EXT ".tmp")) {
            unlink(path);
            continue;
        }
        if (strstr(n, KVS_EXT ".tmp")) {
            unlink(path);
            continue;
        }
        int state = len == 16 + strlen(KVS_EXT) && !strcmp(n + 16, KVS_EXT);
        if (!state && (len != 16 + strlen(KVD_EXT) || strcmp(n + 16, KVD_EXT) != 0)) continue;
        char *end;
        uint64_t hash = strtoull(n, &end, 16);
        if (end != n + 16) continue;
        struct stat sb;
        if (stat(path, &sb) != 0) continue;
        add_entry_kind(d, hash, (size_t)sb.st_size, state);
        /* order by modification time: older files leave first */
        d->entries[d->n - 1].age = (uint64_t)sb.st_mtime;
        if (d->clock < (uint64_t)sb.st_mtime) d->clock = (uint64_t)sb.st_mtime;
    }
    closedir(dir);
}

loom_status loom_kvdisk_open(const char *dir, size_t cap, loom_kv_pool *p, loom_kvdisk **out) {
    *out = NULL;
    if (!p->cache_on)
        return loom_err(LOOM_ERR_INVALID_ARG, "prefix cache disk tier: the prefix cache is off");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return loom_err(LOOM_ERR_IO, "prefix cache directory %s: %s", dir, strerror(errno));
    loom_kvdisk *d = calloc(1, sizeof *d);
    if (!d) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    d->dir = strdup(dir);
    d->cap = cap;
    d->block_size = p->lay.block_size;
    d->n_layers = p->lay.n_layers;
    d->kv_dim = p->lay.kv_dim;
    d->dtype_code = p->lay.mixed ? (int)KVD_MIXED : (int)p->lay.type;
    d->payload = 0;
    for (int l = 0; l < p->lay.n_layers; l++) d->payload += 2 * p->lay.layer[l].row_bytes * (size_t)p->lay.block_size;
    d->file_size = KVD_HEADER + sizeof(int32_t) * (size_t)p->lay.block_size + d->payload;
    d->buf = malloc(d->file_size + 1);
    if (d->buf && loom_kvdisk_reader_create(d, &d->rd) != LOOM_OK) d->buf = (free(d->buf), NULL);
    if (!d->dir || !d->buf) {
        loom_kvdisk_close(d, NULL);
        return loom_err(LOOM_ERR_NOMEM, "out of memory");
    }
    scan(d);
    enforce_cap(d);
    if (access(dir, W_OK) != 0) disable(d, "directory is not writable");
    p->tier = (loom_kv_tier){.ctx = d, .spill = spill, .fetch = fetch};
    *out = d;
    return LOOM_OK;
}

void loom_kvdisk_close(loom_kvdisk *d, loom_kv_pool *p) {
    if (!d) return;
    if (p && p->tier.ctx == d) p->tier = (loom_kv_tier){0};
    free(d->dir);
    free(d->entries);
    free(d->buf);
    free(d->zbuf);
    loom_kvdisk_reader_free(d->rd);
    free(d);
}

loom_status loom_kvdisk_set_zstd(loom_kvdisk *d, int level) {
#ifdef LOOM_ZSTD
    if (level < 0 || level > ZSTD_maxCLevel())
        return loom_err(LOOM_ERR_INVALID_ARG, "prefix cache disk tier: zstd level %d (expected 0..%d)",
                        level, ZSTD_maxCLevel());
    if (level > 0 && !d->zbuf) {
        d->zbuf_cap = ZSTD_compressBound(d->payload);
        d->zbuf = malloc(d->zbuf_cap);
        if (!d->zbuf) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    }
    d->zstd_level = level;
    return LOOM_OK;
#else
    (void)d;
    if (level == 0) return LOOM_OK;
    return loom_err(LOOM_ERR_UNSUPPORTED, "prefix cache disk tier: zstd level %d asked, but this loom "
                    "was built without zstd (install libzstd-dev and rebuild)", level);
#endif
}

void loom_kvdisk_get_stats(const loom_kvdisk *d, loom_kvdisk_stats *s) { *s = d->st; }

int loom_kvdisk_put_state(loom_kvdisk *d, uint64_t hash, int n_tokens, const void *state,
                          size_t bytes) {
    if (d->st.disabled) return -1;
    if (find_entry_kind(d, hash, 1) >= 0) {
        add_entry_kind(d, hash, KVD_HEADER + bytes, 1);
        return 0;
    }
    uint8_t h[KVD_HEADER];
    memset(h, 0, sizeof h);
    memcpy(h, KVS_MAGIC, 8);
    put32(h + 8, KVD_VERSION);
    put32(h + 12, KVD_HEADER);
    put32(h + 16, (uint32_t)n_tokens);
    put64(h + 32, hash);
    put64(h + 48, bytes);
    put64(h + 56, XXH64(state, bytes, 0));
    char path[4096], tmp[4200];
    file_name_kind(d, hash, 1, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        disable(d, strerror(errno));
        return -1;
    }
    int ok = fwrite(h, 1, sizeof h, f) == sizeof h && fwrite(state, 1, bytes, f) == bytes;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        disable(d, "cannot write a state snapshot");
        return -1;
    }
    d->st.writes++;
    d->st.write_bytes += KVD_HEADER + bytes;
    add_entry_kind(d, hash, KVD_HEADER + bytes, 1);
    enforce_cap(d);
    return 0;
}

static int bad_state(loom_kvdisk *d, uint64_t hash, const char *why) {
    char path[4096];
    file_name_kind(d, hash, 1, path, sizeof path);
    loom_log(LOOM_LOG_WARN, "prefix cache file %s: %s; deleted", path, why);
    d->st.bad_files++;
    remove_file_kind(d, hash, 1);
    return -1;
}

int loom_kvdisk_has_state(const loom_kvdisk *d, uint64_t hash) { return find_entry_kind(d, hash, 1) >= 0; }

int loom_kvdisk_read_state(const loom_kvdisk *d, uint64_t hash, int *n_tokens, void *state, size_t bytes,
                           const char **why) {
    *why = NULL;
    char path[4096];
    file_name_kind(d, hash, 1, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) return LOOM_KVDISK_GONE;
    uint8_t h[KVD_HEADER];
    char extra;
    int ok = fread(h, 1, sizeof h, f) == sizeof h && fread(state, 1, bytes, f) == bytes &&
             fread(&extra, 1, 1, f) == 0;
    fclose(f);
#define BAD(text) return (*why = (text), LOOM_KVDISK_BAD)
    if (!ok) BAD("wrong size (truncated or foreign)");
    if (memcmp(h, KVS_MAGIC, 8) != 0) BAD("bad magic");
    if (get32(h + 8) != KVD_VERSION || get32(h + 12) != KVD_HEADER) BAD("unsupported version");
    if (get64(h + 48) != bytes) BAD("state size differs from this model's");
    if (get64(h + 32) != hash) BAD("hash does not match the file name");
    if (XXH64(state, bytes, 0) != get64(h + 56)) BAD("checksum mismatch");
#undef BAD
    *n_tokens = (int)get32(h + 16);
    return LOOM_KVDISK_OK;
}

void loom_kvdisk_account_state(loom_kvdisk *d, uint64_t hash, int result, const char *why, size_t bytes) {
    int i;
    switch (result) {
    case LOOM_KVDISK_OK:
        d->st.reads++;
        d->st.read_bytes += KVD_HEADER + bytes;
        add_entry_kind(d, hash, KVD_HEADER + bytes, 1);
        break;
    case LOOM_KVDISK_GONE:
        if ((i = find_entry_kind(d, hash, 1)) >= 0) drop_entry(d, i);
        break;
    case LOOM_KVDISK_BAD:
        bad_state(d, hash, why);
        break;
    default:
        break;
    }
}

int loom_kvdisk_get_state(loom_kvdisk *d, uint64_t hash, int *n_tokens, void *state, size_t bytes) {
    if (find_entry_kind(d, hash, 1) < 0) return -1;
    const char *why;
    int r = loom_kvdisk_read_state(d, hash, n_tokens, state, bytes, &why);
    loom_kvdisk_account_state(d, hash, r, why, bytes);
    return r == LOOM_KVDISK_OK ? 0 : -1;
}
