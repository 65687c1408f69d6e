/* test_media: image content parts to bytes (serve/media.c): base64 data:
 * URLs (good, bad characters, bad length, empty, other media types),
 * file:// URLs under --allowed-media-dir (inside, outside, "..", a symlink
 * out of the directory, a directory, none allowed), http(s) refused; and
 * the base64 decoder against random bytes encoded here. */
#include <limits.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "serve/media.h"
#include "test.h"

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static size_t encode(const uint8_t *in, size_t n, char *out, int pad) {
    size_t w = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) |
                     (i + 2 < n ? in[i + 2] : 0);
        size_t k = n - i >= 3 ? 4 : n - i + 1;
        for (size_t j = 0; j < 4; j++)
            if (j < k) out[w++] = B64[v >> (18 - 6 * j) & 63];
            else if (pad) out[w++] = '=';
    }
    out[w] = 0;
    return w;
}

static void base64_roundtrip(void) {
    unsigned long long seed = 7;
    uint8_t in[64], out[64 + 3];
    char text[100];
    for (int n = 0; n < 64; n++)
        for (int pad = 0; pad < 2; pad++) {
            for (int i = 0; i < n; i++) in[i] = (uint8_t)test_rand_u32(&seed);
            size_t len = encode(in, (size_t)n, text, pad), bad = 0;
            long got = api_base64_decode(text, len, out, &bad);
            CHECKF(got == n && !memcmp(in, out, (size_t)n), "%d bytes, pad %d: decoded %ld", n, pad, got);
        }
    size_t bad = 0;
    CHECK(api_base64_decode("QUJD\nRA==", 9, out, &bad) < 0 && bad == 4);
    CHECK(api_base64_decode("QUJDR", 5, out, &bad) < 0);   /* 6 bits cannot end a byte */
    CHECK(api_base64_decode("QUJDRA=", 7, out, &bad) < 0); /* padded, but not to 4 */
    CHECK(api_base64_decode("QU=D", 4, out, &bad) < 0 && bad == 2);
}

/* api_media_load of url must fail with a 400 whose message holds want. */
static void refuses(const char *url, const char *dir, const char *want) {
    uint8_t *data = NULL;
    size_t len = 0;
    api_error e = {0};
    int rc = api_media_load(url, dir, "messages[0].content[1]", &data, &len, &e);
    CHECKF(rc < 0 && e.status == 400 && !strcmp(e.param, "messages[0].content[1]") &&
           strstr(e.message, want), "%.60s: rc %d status %d \"%s\", want \"%s\"", url, rc, e.status,
           e.message, want);
    CHECK(data == NULL);
    free(data);
}

static void loads(const char *url, const char *dir, const void *want, size_t n) {
    uint8_t *data = NULL;
    size_t len = 0;
    api_error e = {0};
    int rc = api_media_load(url, dir, "p", &data, &len, &e);
    CHECKF(rc == 0 && len == n && !memcmp(data, want, n), "%.60s: rc %d, %zu bytes (%s)", url, rc,
           len, e.message);
    free(data);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void urls(void) {
    loads("data:image/png;base64,iVBORw0KGgo=", NULL, "\x89PNG\r\n\x1a\n", 8);
    loads("DATA:image/JPEG;base64,/9j/", NULL, "\xff\xd8\xff", 3);
    refuses("data:image/png;base64,iVBO Rw0K", NULL, "bad base64 in the data: URL at offset 4");
    refuses("data:image/png;base64,", NULL, "holds no data");
    refuses("data:image/png;base64,iVBORw0KGg=", NULL, "bad base64"); /* padded to 11 */
    refuses("data:image/gif;base64,R0lG", NULL, "found data:image/gif;base64");
    refuses("data:image/png,rawbytes", NULL, "found data:image/png");
    refuses("data:image/png;base64", NULL, "needs a comma");
    refuses("https://example.com/a.png", NULL, "not fetched");
    refuses("http://127.0.0.1/a.png", "/", "not fetched");
    refuses("ftp://x/a.png", NULL, "expected a data: or file:// URL");

    char dir[] = "/tmp/loom-test-media-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char allowed[256], outside[256], path[512], url[1024];
    snprintf(allowed, sizeof allowed, "%s/allowed", dir);
    snprintf(outside, sizeof outside, "%s/secret.png", dir);
    CHECK(mkdir(allowed, 0700) == 0);
    snprintf(path, sizeof path, "%s/sub", allowed);
    CHECK(mkdir(path, 0700) == 0);
    snprintf(path, sizeof path, "%s/sub/a b.png", allowed);
    write_file(path, "inside");
    write_file(outside, "outside");
    snprintf(path, sizeof path, "%s/link.png", allowed);
    CHECK(symlink(outside, path) == 0);
    snprintf(path, sizeof path, "%s/dirlink", allowed);
    CHECK(symlink(dir, path) == 0);

    snprintf(url, sizeof url, "file://%s/sub/a%%20b.png", allowed);
    loads(url, allowed, "inside", 6);
    refuses(url, NULL, "without --allowed-media-dir");
    snprintf(url, sizeof url, "file://localhost%s/sub/a%%20b.png", allowed);
    loads(url, allowed, "inside", 6);
    snprintf(url, sizeof url, "file://%s", outside);
    refuses(url, allowed, "is outside --allowed-media-dir");
    snprintf(url, sizeof url, "file://%s/sub/../../secret.png", allowed);
    refuses(url, allowed, "is outside --allowed-media-dir");
    snprintf(url, sizeof url, "file://%s/link.png", allowed); /* a symlink out of it */
    refuses(url, allowed, "is outside --allowed-media-dir");
    snprintf(url, sizeof url, "file://%s/dirlink/secret.png", allowed); /* through a dir link */
    refuses(url, allowed, "is outside --allowed-media-dir");
    snprintf(url, sizeof url, "file://%s/sub", allowed);
    refuses(url, allowed, "is not a readable file");
    snprintf(url, sizeof url, "file://%s/missing.png", allowed);
    refuses(url, allowed, "No such file");
    snprintf(url, sizeof url, "file://%s/sub/a%%00b.png", allowed);
    refuses(url, allowed, "NUL");
    refuses("file://relative/a.png", allowed, "expected file:///absolute/path");
    /* a directory whose name extends the allowed one is not inside it */
    snprintf(path, sizeof path, "%s/allowed2", dir);
    CHECK(mkdir(path, 0700) == 0);
    snprintf(path, sizeof path, "%s/allowed2/x.png", dir);
    write_file(path, "sibling");
    snprintf(url, sizeof url, "file://%s", path);
    refuses(url, allowed, "is outside --allowed-media-dir");

    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

int main(void) {
    base64_roundtrip();
    urls();
    return test_report("test_media");
}
