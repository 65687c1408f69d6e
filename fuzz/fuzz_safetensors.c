/* libFuzzer target: the safetensors reader (loom_st_open) on a file's
 * bytes.
 *
 * Input: a whole .safetensors file (u64 header length, JSON header, data).
 * An open either fails with *out NULL and a message, or every tensor it
 * lists holds up to what the header comment of safetensors.h promises:
 *   - nbytes is the product of the shape times the element size;
 *   - data is aligned to the element size (a header of any length moves
 *     the data section; misaligned tensors are read from a copy);
 *   - every byte of data can be read (a read past the mapping faults);
 *   - the names are unique and loom_st_find finds each one;
 *   - loom_st_describe stays inside its buffer. */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/base.h"
#include "load/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* loom_st_open maps a path: the input goes to an anonymous file */
    int fd = memfd_create("fuzz-st", MFD_CLOEXEC);
    if (fd < 0 || (size && write(fd, data, size) != (ssize_t)size)) {
        if (fd >= 0) close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    loom_safetensors *st = (loom_safetensors *)1;
    loom_status s = loom_st_open(path, &st);
    if (s != LOOM_OK) {
        assert(st == NULL && loom_last_error()[0]);
        close(fd);
        return 0;
    }
    volatile uint8_t sink = 0;
    for (int i = 0; i < loom_st_count(st); i++) {
        const loom_st_tensor *t = loom_st_at(st, i);
        size_t es = loom_dtype_size(t->dtype);
        uint64_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
        assert(es && n * es == t->nbytes);
        assert(!t->nbytes || (uintptr_t)t->data % es == 0);
        for (size_t b = 0; b < t->nbytes; b++) sink ^= ((const uint8_t *)t->data)[b];
        assert(loom_st_find(st, t->name) == t);
        if (i) assert(strcmp(loom_st_at(st, i - 1)->name, t->name) < 0);
        char buf[24];
        loom_st_describe(t, buf, sizeof buf);
        assert(memchr(buf, 0, sizeof buf));
    }
    (void)sink;
    loom_st_close(st);
    close(fd);
    return 0;
}
