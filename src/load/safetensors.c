/* safetensors: mmap'd reader with full header validation, and a writer.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
 * {...}}, then the data section; offsets are relative to its start. */
#include "load/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

/* Headers larger than this are rejected as corrupt (real ones are < 10 MB). */
#define ST_MAX_HEADER (100u << 20)

static const struct { const char *name; size_t size; } dtypes[LOOM_DT_COUNT] = {
    [LOOM_DT_F32] = {"F32", 4},  [LOOM_DT_F16] = {"F16", 2},
    [LOOM_DT_BF16] = {"BF16", 2}, [LOOM_DT_F64] = {"F64", 8},
    [LOOM_DT_U32] = {"U32", 4},  [LOOM_DT_I32] = {"I32", 4},
    [LOOM_DT_I64] = {"I64", 8},  [LOOM_DT_U8] = {"U8", 1},
    [LOOM_DT_I8] = {"I8", 1},    [LOOM_DT_U16] = {"U16", 2},
    [LOOM_DT_I16] = {"I16", 2},  [LOOM_DT_BOOL] = {"BOOL", 1},
    [LOOM_DT_F8_E4M3] = {"F8_E4M3", 1},
};

const char *loom_dtype_name(loom_dtype t) {
    return (unsigned)t < LOOM_DT_COUNT ? dtypes[t].name : "?";
}
size_t loom_dtype_size(loom_dtype t) {
    return (unsigned)t < LOOM_DT_COUNT ? dtypes[t].size : 0;
}

typedef struct st_map {
    void *base;        /* owned mapping */
    size_t size;
    cJSON *metadata;   /* owned, may be NULL */
    void *copy;        /* owned mapping of realigned tensors (realign), or NULL */
    size_t copy_size;
} st_map;

struct loom_safetensors {
    st_map *maps;            /* owned [n_maps] */
    int n_maps;
    loom_st_tensor *tensors; /* owned [n_tensors], sorted by name */
    int n_tensors;
};

void loom_st_describe(const loom_st_tensor *t, char *buf, size_t n) {
    size_t w = (size_t)snprintf(buf, n, "%s [", loom_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && w < n; i++)
        w += (size_t)snprintf(buf + w, n - w, "%s%lld", i ? ", " : "",
                              (long long)t->shape[i]);
    if (w < n) snprintf(buf + w, n - w, "]");
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const loom_st_tensor *)a)->name,
                  ((const loom_st_tensor *)b)->name);
}

typedef struct span { uint64_t begin, end; const char *name; } span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Parses one tensor entry of a header; appends to st->tensors. */
static loom_status parse_entry(const char *path, const cJSON *e,
                               const uint8_t *data, uint64_t data_size,
                               loom_st_tensor *t, span *sp) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return loom_err(LOOM_ERR_FORMAT, "%s: tensor %s: expected an object in the header", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) ||
        cJSON_GetArraySize(offs) != 2)
        return loom_err(LOOM_ERR_FORMAT,
                        "%s: tensor %s: expected dtype, shape and data_offsets [begin, end]",
                        path, name);
    int found = -1;
    for (int i = 0; i < LOOM_DT_COUNT; i++)
        if (!strcmp(dt->valuestring, dtypes[i].name)) found = i;
    if (found < 0)
        return loom_err(LOOM_ERR_UNSUPPORTED,
                        "%s: tensor %s: unknown dtype \"%s\" (expected one of F32, F16, BF16, "
                        "F64, F8_E4M3, U32, I32, I64, U16, I16, U8, I8, BOOL)",
                        path, name, dt->valuestring);
    t->dtype = (loom_dtype)found;
    t->ndim = cJSON_GetArraySize(shape);
    if (t->ndim > LOOM_ST_MAX_DIMS)
        return loom_err(LOOM_ERR_UNSUPPORTED, "%s: tensor %s: %d dimensions, at most %d supported",
                        path, name, t->ndim, LOOM_ST_MAX_DIMS);
    uint64_t count = 1;
    for (int i = 0; i < t->ndim; i++) {
        const cJSON *d = cJSON_GetArrayItem(shape, i);
        if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 9.0e15 ||
            d->valuedouble != (double)(int64_t)d->valuedouble)
            return loom_err(LOOM_ERR_FORMAT, "%s: tensor %s: shape[%d] is not a non-negative integer",
                            path, name, i);
        t->shape[i] = (int64_t)d->valuedouble;
        if (t->shape[i] && count > UINT64_MAX / (uint64_t)t->shape[i])
            return loom_err(LOOM_ERR_FORMAT, "%s: tensor %s: shape overflows", path, name);
        count *= (uint64_t)t->shape[i];
    }
    double b = cJSON_GetArrayItem(offs, 0)->valuedouble;
    double en = cJSON_GetArrayItem(offs, 1)->valuedouble;
    if (!cJSON_IsNumber(cJSON_GetArrayItem(offs, 0)) ||
        !cJSON_IsNumber(cJSON_GetArrayItem(offs, 1)) || b < 0 || en < b || en > 1.8e19 ||
        b != floor(b) || en != floor(en))
        return loom_err(LOOM_ERR_FORMAT, "%s: tensor %s: bad data_offsets [%.0f, %.0f]",
                        path, name, b, en);
    uint64_t begin = (uint64_t)b, end = (uint64_t)en;
    if (end > data_size)
        return loom_err(LOOM_ERR_FORMAT,
                        "%s: tensor %s: data_offsets [%llu, %llu] past the end of the data "
                        "section (%llu bytes; file truncated?)",
                        path, name, (unsigned long long)begin, (unsigned long long)end,
                        (unsigned long long)data_size);
    if (count > UINT64_MAX / dtypes[found].size)
        return loom_err(LOOM_ERR_FORMAT, "%s: tensor %s: shape overflows", path, name);
    uint64_t want = count * dtypes[found].size;
    if (end - begin != want)
        return loom_err(LOOM_ERR_FORMAT,
                        "%s: tensor %s: %s of %llu elements needs %llu bytes, data_offsets "
                        "give %llu",
                        path, name, dtypes[found].name, (unsigned long long)count,
                        (unsigned long long)want, (unsigned long long)(end - begin));
    t->data = data + begin;
    t->nbytes = (size_t)want;
    sp->begin = begin;
    sp->end = end;
    sp->name = name;
    return LOOM_OK;
}

/* The kernels load whole elements (uint16 for BF16/F16 and the quantized
 * scales, uint32 for packed quantized words), so a tensor must start at a
 * multiple of its element size. */
static int misaligned(const loom_st_tensor *t) {
    return t->nbytes && (uintptr_t)t->data % dtypes[t->dtype].size != 0;
}

#define ST_COPY_ALIGN(n) (((n) + 63) & ~(size_t)63)

/* The format lets the header have any length (it may be padded with
 * spaces), so the data section, or a tensor in it, can start at an offset
 * its elements cannot be loaded from. Those tensors are copied once, at
 * 64-byte offsets, into a mapping m owns. The copy is a shared mapping of
 * an anonymous file rather than heap memory so that it stays file-backed:
 * loom_st_release() drops pages with MADV_DONTNEED, which zeroes private
 * anonymous memory but only unmaps the pages of a file. */
static loom_status realign(const char *path, st_map *m, loom_st_tensor *ts, int n) {
    size_t need = 0;
    int count = 0;
    for (int i = 0; i < n; i++)
        if (misaligned(&ts[i])) need += ST_COPY_ALIGN(ts[i].nbytes), count++;
    if (!count) return LOOM_OK;
    int fd = memfd_create("loom-realigned", MFD_CLOEXEC);
    if (fd < 0) return loom_err(LOOM_ERR_NOMEM, "%s: memfd_create: %s", path, strerror(errno));
    void *p = ftruncate(fd, (off_t)need) == 0
                  ? mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED)
        return loom_err(LOOM_ERR_NOMEM, "%s: no room for a %zu-byte aligned copy of %d tensors: %s",
                        path, need, count, strerror(errno));
    m->copy = p;
    m->copy_size = need;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!misaligned(&ts[i])) continue;
        memcpy((uint8_t *)p + off, ts[i].data, ts[i].nbytes);
        ts[i].data = (uint8_t *)p + off;
        off += ST_COPY_ALIGN(ts[i].nbytes);
    }
    mprotect(p, need, PROT_READ);
    loom_log(LOOM_LOG_INFO, "%s: %d tensors are not aligned to their element size in the file; "
             "reading a %zu-byte aligned copy", path, count, need);
    return LOOM_OK;
}

/* Maps path and appends its tensors to st. */
static loom_status open_one(loom_safetensors *st, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return loom_err(LOOM_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return loom_err(LOOM_ERR_IO, "%s: %s", path, strerror(errno));
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return loom_err(LOOM_ERR_FORMAT, "%s: file is %zu bytes, expected at least 8 (header length)",
                        path, size);
    }
    void *base = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (base == MAP_FAILED) return loom_err(LOOM_ERR_IO, "%s: mmap: %s", path, strerror(errno));

    st_map *maps = realloc(st->maps, sizeof *maps * (size_t)(st->n_maps + 1));
    if (!maps) {
        munmap(base, size);
        return loom_err(LOOM_ERR_NOMEM, "%s: out of memory", path);
    }
    st->maps = maps;
    st_map *m = &st->maps[st->n_maps++];
    m->base = base;
    m->size = size;
    m->metadata = NULL;
    m->copy = NULL;
    m->copy_size = 0;
    int first = st->n_tensors;

    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | ((const uint8_t *)base)[i];
    if (hlen > size - 8 || hlen > ST_MAX_HEADER)
        return loom_err(LOOM_ERR_FORMAT,
                        "%s: header length %llu runs past the end of the file (%zu bytes)",
                        path, (unsigned long long)hlen, size);
    cJSON *h = cJSON_ParseWithLength((const char *)base + 8, (size_t)hlen);
    if (!h || !cJSON_IsObject(h)) {
        cJSON_Delete(h);
        return loom_err(LOOM_ERR_FORMAT, "%s: header is not a JSON object (corrupt file?)", path);
    }
    const uint8_t *data = (const uint8_t *)base + 8 + hlen;
    uint64_t data_size = size - 8 - hlen;
    int n = 0;
    for (cJSON *e = h->child; e; e = e->next) n++;
    loom_st_tensor *ts = realloc(st->tensors, sizeof *ts * (size_t)(st->n_tensors + n + 1));
    span *spans = malloc(sizeof *spans * (size_t)(n + 1));
    if (!ts || !spans) {
        if (ts) st->tensors = ts;
        free(spans);
        cJSON_Delete(h);
        return loom_err(LOOM_ERR_NOMEM, "%s: out of memory", path);
    }
    st->tensors = ts;
    loom_status s = LOOM_OK;
    int ns = 0;
    for (cJSON *e = h->child; e && s == LOOM_OK; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            m->metadata = cJSON_DetachItemViaPointer(h, e);
            break;
        }
    }
    for (cJSON *e = h->child; e && s == LOOM_OK; e = e->next) {
        loom_st_tensor *t = &st->tensors[st->n_tensors];
        memset(t, 0, sizeof *t);
        s = parse_entry(path, e, data, data_size, t, &spans[ns]);
        if (s != LOOM_OK) break;
        t->name = strdup(e->string);
        if (!t->name) { s = loom_err(LOOM_ERR_NOMEM, "out of memory"); break; }
        st->n_tensors++;
        if (spans[ns].end > spans[ns].begin) ns++;
    }
    if (s == LOOM_OK) {
        qsort(spans, (size_t)ns, sizeof *spans, cmp_span);
        for (int i = 1; i < ns; i++)
            if (spans[i].begin < spans[i - 1].end) {
                s = loom_err(LOOM_ERR_FORMAT, "%s: tensors %s and %s overlap in the data section",
                             path, spans[i - 1].name, spans[i].name);
                break;
            }
    }
    free(spans);
    cJSON_Delete(h);
    if (s == LOOM_OK) s = realign(path, m, st->tensors + first, st->n_tensors - first);
    return s;
}

static loom_status finish(loom_safetensors *st) {
    qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, cmp_tensor_name);
    for (int i = 1; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i].name, st->tensors[i - 1].name))
            return loom_err(LOOM_ERR_FORMAT, "tensor %s appears twice", st->tensors[i].name);
    return LOOM_OK;
}

loom_status loom_st_open(const char *path, loom_safetensors **out) {
    *out = NULL;
    loom_safetensors *st = calloc(1, sizeof *st);
    if (!st) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    loom_status s = open_one(st, path);
    if (s == LOOM_OK) s = finish(st);
    if (s != LOOM_OK) {
        loom_st_close(st);
        return s;
    }
    *out = st;
    return LOOM_OK;
}

/* Opens every distinct shard named by an index file's weight_map. */
static loom_status open_index(loom_safetensors *st, const char *dir,
                              const char *index_path) {
    char *text = NULL;
    loom_status s = loom_read_file(index_path, &text, NULL);
    if (s != LOOM_OK) return s;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(j);
        return loom_err(LOOM_ERR_FORMAT, "%s: expected a JSON object with \"weight_map\"", index_path);
    }
    /* Shard names, deduplicated in order of first appearance. */
    const char **seen = NULL;
    int n_seen = 0;
    for (const cJSON *e = wm->child; e && s == LOOM_OK; e = e->next) {
        if (!cJSON_IsString(e)) {
            s = loom_err(LOOM_ERR_FORMAT, "%s: weight_map[%s] is not a file name", index_path, e->string);
            break;
        }
        if (strchr(e->valuestring, '/')) {
            s = loom_err(LOOM_ERR_FORMAT, "%s: shard name \"%s\" must be a plain file name",
                         index_path, e->valuestring);
            break;
        }
        int dup = 0;
        for (int i = 0; i < n_seen && !dup; i++) dup = !strcmp(seen[i], e->valuestring);
        if (dup) continue;
        const char **ns = realloc(seen, sizeof *ns * (size_t)(n_seen + 1));
        if (!ns) { s = loom_err(LOOM_ERR_NOMEM, "out of memory"); break; }
        seen = ns;
        seen[n_seen++] = e->valuestring;
        char path[4096];
        s = loom_path_join(path, sizeof path, dir, e->valuestring);
        if (s == LOOM_OK) s = open_one(st, path);
    }
    /* Every mapped name must exist in its shard. */
    if (s == LOOM_OK) s = finish(st);
    for (const cJSON *e = wm->child; e && s == LOOM_OK; e = e->next)
        if (!loom_st_find(st, e->string))
            s = loom_err(LOOM_ERR_FORMAT, "%s: tensor %s is listed in weight_map but missing from %s",
                         index_path, e->string, e->valuestring);
    free(seen);
    cJSON_Delete(j);
    return s;
}

loom_status loom_st_open_dir(const char *dir, loom_safetensors **out) {
    *out = NULL;
    char path[4096];
    loom_status s = loom_path_join(path, sizeof path, dir, "model.safetensors.index.json");
    if (s != LOOM_OK) return s;
    if (access(path, R_OK) != 0) {
        s = loom_path_join(path, sizeof path, dir, "model.safetensors");
        if (s != LOOM_OK) return s;
        if (access(path, R_OK) != 0)
            return loom_err(LOOM_ERR_IO,
                            "%s: no model.safetensors or model.safetensors.index.json", dir);
        return loom_st_open(path, out);
    }
    loom_safetensors *st = calloc(1, sizeof *st);
    if (!st) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    s = open_index(st, dir, path);
    if (s != LOOM_OK) {
        loom_st_close(st);
        return s;
    }
    *out = st;
    return LOOM_OK;
}

void loom_st_close(loom_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    for (int i = 0; i < st->n_maps; i++) {
        munmap(st->maps[i].base, st->maps[i].size);
        if (st->maps[i].copy) munmap(st->maps[i].copy, st->maps[i].copy_size);
        cJSON_Delete(st->maps[i].metadata);
    }
    free(st->maps);
    free(st);
}

int loom_st_count(const loom_safetensors *st) { return st->n_tensors; }

const loom_st_tensor *loom_st_at(const loom_safetensors *st, int i) {
    return i >= 0 && i < st->n_tensors ? &st->tensors[i] : NULL;
}

const loom_st_tensor *loom_st_find(const loom_safetensors *st, const char *name) {
    int lo = 0, hi = st->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (c == 0) return &st->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

const char *loom_st_metadata(const loom_safetensors *st, const char *key) {
    for (int i = 0; i < st->n_maps; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(st->maps[i].metadata, key);
        if (cJSON_IsString(v)) return v->valuestring;
    }
    return NULL;
}

loom_status loom_st_write(const char *path, const loom_st_write_entry *e, int n) {
    cJSON *h = cJSON_CreateObject();
    if (!h) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *t = cJSON_AddObjectToObject(h, e[i].name);
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        uint64_t count = 1;
        for (int d = 0; d < e[i].ndim; d++) {
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e[i].shape[d]));
            count *= (uint64_t)e[i].shape[d];
        }
        cJSON_AddStringToObject(t, "dtype", loom_dtype_name(e[i].dtype));
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        uint64_t bytes = count * loom_dtype_size(e[i].dtype);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + bytes)));
        off += bytes;
    }
    char *json = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!json) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    /* Pad the header with spaces to 8 bytes so the data section is aligned. */
    size_t jl = strlen(json), hl = (jl + 7) & ~(size_t)7;
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp) {
        free(json);
        return loom_err(LOOM_ERR_INVALID_ARG, "path too long: %s", path);
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(json);
        return loom_err(LOOM_ERR_IO, "%s: %s", tmp, strerror(errno));
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(json, 1, jl, f) == jl;
    for (size_t i = jl; i < hl && ok; i++) ok = fputc(' ', f) != EOF;
    free(json);
    for (int i = 0; i < n && ok; i++) {
        uint64_t count = 1;
        for (int d = 0; d < e[i].ndim; d++) count *= (uint64_t)e[i].shape[d];
        size_t bytes = (size_t)(count * loom_dtype_size(e[i].dtype));
        ok = fwrite(e[i].data, 1, bytes, f) == bytes;
    }
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return loom_err(LOOM_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    return LOOM_OK;
}

void loom_st_release(const void *data, size_t n) {
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0 || !n) return;
    uintptr_t a = (uintptr_t)data & ~(uintptr_t)(pg - 1);
    madvise((void *)a, (uintptr_t)data + n - a, MADV_DONTNEED);
}

void loom_st_warm(const loom_safetensors *st, void (*progress)(void *ctx, double done), void *ctx) {
    size_t total = 0, seen = 0, step = 64u << 20;
    for (int i = 0; i < st->n_maps; i++) total += st->maps[i].size;
    volatile uint8_t sink = 0;
    for (int i = 0; i < st->n_maps; i++) {
        const uint8_t *p = st->maps[i].base;
        size_t n = st->maps[i].size;
        madvise(st->maps[i].base, n, MADV_WILLNEED);
        for (size_t off = 0; off < n; off += 4096) {
            sink ^= p[off];
            if (progress && (seen + off) % step < 4096) progress(ctx, (double)(seen + off) / (double)total);
        }
        seen += n;
    }
    (void)sink;
    if (progress) progress(ctx, 1.0);
}
