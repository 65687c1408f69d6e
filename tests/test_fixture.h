/* A model fixture and its reference (tests/fixtures/models/NAME): the
 * model loaded and the prompts of reference.safetensors, for the tests
 * that run the fixtures' prompts through the engine. */
#ifndef LOOM_TEST_FIXTURE_H
#define LOOM_TEST_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "load/safetensors.h"
#include "loom.h"
#include "model/model.h"

#define TEST_FIXTURE_PROMPTS 4 /* prompt.0 .. prompt.3 */

typedef struct test_fixture {
    loom_safetensors *ref;  /* owned: reference.safetensors */
    loom_model *m;          /* owned */
    const int32_t *ids[TEST_FIXTURE_PROMPTS];    /* borrowed from ref: prompt.i.ids */
    int len[TEST_FIXTURE_PROMPTS];
    const int32_t *greedy[TEST_FIXTURE_PROMPTS]; /* prompt.i.greedy, or NULL */
} test_fixture;

static inline void test_fixture_free(test_fixture *f) {
    loom_model_free(f->m);
    loom_st_close(f->ref);
    memset(f, 0, sizeof *f);
}

/* Loads dir's model and reference; 0 (the reason on stderr) if either
 * fails or a prompt is missing. */
static inline int test_fixture_load(const char *dir, test_fixture *f) {
    char path[512];
    memset(f, 0, sizeof *f);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    if (loom_st_open(path, &f->ref) || loom_model_load(dir, NULL, &f->m)) {
        fprintf(stderr, "%s: %s\n", dir, loom_last_error());
        test_fixture_free(f);
        return 0;
    }
    for (int i = 0; i < TEST_FIXTURE_PROMPTS; i++) {
        char name[64];
        snprintf(name, sizeof name, "prompt.%d.ids", i);
        const loom_st_tensor *t = loom_st_find(f->ref, name);
        if (!t) {
            fprintf(stderr, "%s: no %s\n", path, name);
            test_fixture_free(f);
            return 0;
        }
        f->ids[i] = t->data;
        f->len[i] = (int)t->shape[0];
        snprintf(name, sizeof name, "prompt.%d.greedy", i);
        t = loom_st_find(f->ref, name);
        f->greedy[i] = t ? t->data : NULL;
    }
    return 1;
}

#endif
