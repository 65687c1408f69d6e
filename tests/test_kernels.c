/* Which kernel table LOOM_KERNELS picks: each name the table it names
 * where this CPU can run it, otherwise the best one it can with a warning
 * that says why; an unknown name warns too. The table is picked once a
 * process, so each case runs this binary again with --name, which prints
 * the picked table (tests/run.sh asks it before running a suite under
 * LOOM_KERNELS). */
#include <unistd.h>

#include "ops/ops.h"
#include "test.h"

/* The output (stdout and stderr) of this binary run with --name under
 * LOOM_KERNELS=force; NULL on failure. */
static char *run_named(const char *self, const char *force) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "LOOM_KERNELS='%s' '%s' --name 2>&1", force, self);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    static char out[1024];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    return pclose(p) == 0 ? out : NULL;
}

static void expect(const char *self, const char *force, const char *table, const char *warning) {
    const char *out = run_named(self, force);
    CHECKF(out != NULL, "LOOM_KERNELS=%s: the probe failed", force);
    if (!out) return;
    char all[1100], line[64];
    snprintf(all, sizeof all, "\n%s", out); /* the name is a line of its own */
    snprintf(line, sizeof line, "\n%s\n", table);
    CHECKF(strstr(all, line) != NULL, "LOOM_KERNELS=%s: expected the %s table, found \"%s\"", force, table, out);
    if (warning) CHECKF(strstr(out, warning) != NULL, "LOOM_KERNELS=%s: no warning \"%s\" in \"%s\"", force, warning, out);
    else CHECKF(!strstr(out, "warn"), "LOOM_KERNELS=%s: unexpected warning in \"%s\"", force, out);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--name")) {
        printf("%s\n", loom_kernels_get()->name);
        fflush(stdout);
        return 0;
    }
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "test_kernels: cannot find this binary (/proc/self/exe)\n");
        return 1;
    }
    self[n] = 0;
    int avx2 = 0, avx512 = loom_cpu_has_avx512();
#if defined(__x86_64__)
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
    const char *best = avx512 && avx2 ? "avx512" : avx2 ? "avx2" : "ref";
    expect(self, "", best, NULL);
    expect(self, "ref", "ref", NULL);
    if (avx2) expect(self, "avx2", "avx2", NULL);
    else expect(self, "avx2", "ref", "cannot run the avx2 kernels");
    if (avx2 && avx512) expect(self, "avx512", "avx512", NULL);
    else expect(self, "avx512", best, "cannot run the avx512 kernels");
    expect(self, "avx1024", best, "LOOM_KERNELS=avx1024: expected ref, avx2 or avx512");
    fprintf(stderr, "test_kernels: this CPU runs %s%s\n", best, avx512 ? "" : " (no AVX-512 F/BW/DQ/VL/VNNI/BF16)");
    return test_report("test_kernels");
}
