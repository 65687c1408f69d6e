/* safetensors: read-only access to .safetensors files over mmap, one file
 * or a sharded set (model.safetensors.index.json), and a small writer.
 *
 * Tensor data is borrowed from the mapping (or, for a tensor the file
 * places at an offset that is not a multiple of its element size, from an
 * aligned copy): pointers stay valid until loom_st_close() and are aligned
 * to the element size. Every header is validated on open (offsets inside the
 * file, sizes matching dtype x shape, no overlaps), so consumers can trust
 * nbytes. */
#ifndef LOOM_SAFETENSORS_H
#define LOOM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

typedef enum loom_dtype {
    LOOM_DT_F32, LOOM_DT_F16, LOOM_DT_BF16, LOOM_DT_F64,
    LOOM_DT_U32, LOOM_DT_I32, LOOM_DT_I64, LOOM_DT_U8, LOOM_DT_I8,
    LOOM_DT_U16, LOOM_DT_I16, LOOM_DT_BOOL,
    LOOM_DT_F8_E4M3,               /* float8 e4m3fn (bias 7, no infinities) */
    LOOM_DT_COUNT
} loom_dtype;

const char *loom_dtype_name(loom_dtype t);
size_t loom_dtype_size(loom_dtype t);

#define LOOM_ST_MAX_DIMS 8

typedef struct loom_st_tensor {
    char *name;                    /* owned */
    loom_dtype dtype;
    int ndim;
    int64_t shape[LOOM_ST_MAX_DIMS];
    const void *data;              /* borrowed; aligned to the element size */
    size_t nbytes;
} loom_st_tensor;

typedef struct loom_safetensors loom_safetensors;

/* Opens one .safetensors file. */
loom_status loom_st_open(const char *path, loom_safetensors **out);
/* Opens a model directory: model.safetensors.index.json (sharded) if it
 * exists, else model.safetensors. */
loom_status loom_st_open_dir(const char *dir, loom_safetensors **out);
void loom_st_close(loom_safetensors *st);

int loom_st_count(const loom_safetensors *st);
const loom_st_tensor *loom_st_at(const loom_safetensors *st, int i);
/* NULL if absent. */
const loom_st_tensor *loom_st_find(const loom_safetensors *st, const char *name);
/* Value of a string in __metadata__ (first file that has it), or NULL. */
const char *loom_st_metadata(const loom_safetensors *st, const char *key);

/* Reads every page of the mapped files so the first forward does not stall
 * on disk; progress (may be NULL) gets the fraction done now and then. */
void loom_st_warm(const loom_safetensors *st, void (*progress)(void *ctx, double done), void *ctx);
/* Drops the pages under [data, data + n) of a mapping from this process
 * (the mappings are read-only and file-backed: a later touch reads them
 * back), so bytes already converted elsewhere stop counting as resident. */
void loom_st_release(const void *data, size_t n);

/* Formats "F32 [3, 4]" into buf. */
void loom_st_describe(const loom_st_tensor *t, char *buf, size_t n);

/* Writes tensors to path (atomically: temp file + rename). Each entry gives
 * name, dtype, shape and data. */
typedef struct loom_st_write_entry {
    const char *name;
    loom_dtype dtype;
    int ndim;
    int64_t shape[LOOM_ST_MAX_DIMS];
    const void *data;
} loom_st_write_entry;

loom_status loom_st_write(const char *path, const loom_st_write_entry *e,
                          int n);

#endif
