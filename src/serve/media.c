/* media: image content parts to encoded image bytes (see media.h). */
#include "serve/media.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

int api_media_is_image(const cJSON *part) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    return cJSON_IsString(type) && !strcmp(type->valuestring, "image_url");
}

int api_media_url(const cJSON *part, const char *param, const char **url, api_error *err) {
    const cJSON *iu = cJSON_GetObjectItemCaseSensitive(part, "image_url");
    if (cJSON_IsObject(iu)) iu = cJSON_GetObjectItemCaseSensitive(iu, "url");
    if (!cJSON_IsString(iu) || !iu->valuestring[0])
        return api_fail(err, 400, param, "'%s': an image_url part needs \"image_url\": {\"url\": "
                        "\"data:image/png;base64,...\"}", param);
    *url = iu->valuestring;
    return 0;
}

static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

long api_base64_decode(const char *s, size_t n, uint8_t *out, size_t *bad) {
    size_t end = n;
    while (end > 0 && n - end < 2 && s[end - 1] == '=') end--; /* padding */
    uint32_t acc = 0;
    int bits = 0;
    long len = 0;
    for (size_t i = 0; i < end; i++) {
        int v = b64_value((unsigned char)s[i]);
        if (v < 0) {
            *bad = i;
            return -1;
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[len++] = (uint8_t)(acc >> bits);
        }
    }
    if (end % 4 == 1 || (n != end && n % 4)) { /* six bits end no byte; padding is to 4 */
        *bad = end % 4 == 1 ? end - 1 : end;
        return -1;
    }
    return len;
}

/* data:[<type>][;base64],<data> */
static int load_data_url(const char *url, const char *param, uint8_t **data, size_t *len,
                         api_error *err) {
    const char *comma = strchr(url, ',');
    if (!comma)
        return api_fail(err, 400, param, "'%s': a data: URL needs a comma before its data", param);
    const char *meta = url + 5;
    size_t mlen = (size_t)(comma - meta);
    static const char *const types[] = {"image/png;base64", "image/jpeg;base64", "image/jpg;base64"};
    int known = 0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(types); i++)
        known |= mlen == strlen(types[i]) && !strncasecmp(meta, types[i], mlen);
    if (!known)
        return api_fail(err, 400, param, "'%s': expected a data:image/png;base64 or "
                        "data:image/jpeg;base64 URL, found data:%.*s", param,
                        (int)LOOM_MIN(mlen, (size_t)64), meta);
    const char *b64 = comma + 1;
    size_t n = strlen(b64), bad = 0;
    uint8_t *out = malloc(n / 4 * 3 + 3);
    if (!out) return api_fail(err, 500, NULL, "out of memory");
    long got = api_base64_decode(b64, n, out, &bad);
    if (got <= 0) {
        free(out);
        if (got == 0) return api_fail(err, 400, param, "'%s': the data: URL holds no data", param);
        return api_fail(err, 400, param, "'%s': bad base64 in the data: URL at offset %zu (byte "
                        "0x%02x)", param, bad, (unsigned)(unsigned char)b64[bad < n ? bad : n - 1]);
    }
    *data = out;
    *len = (size_t)got;
    return 0;
}

static int hex(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* file://[localhost]/path, %XX decoded, under allowed_dir. */
static int load_file_url(const char *url, const char *allowed_dir, const char *param,
                         uint8_t **data, size_t *len, api_error *err) {
    if (!allowed_dir)
        return api_fail(err, 400, param, "'%s': file:// URLs are refused (the server was started "
                        "without --allowed-media-dir)", param);
    const char *p = url + 7;
    if (!strncmp(p, "localhost/", 10)) p += 9;
    if (*p != '/')
        return api_fail(err, 400, param, "'%s': expected file:///absolute/path, found %.80s",
                        param, url);
    char path[PATH_MAX];
    size_t k = 0;
    for (; *p && k + 1 < sizeof path; p++) {
        int a, b;
        if (*p == '%' && (a = hex(p[1])) >= 0 && (b = hex(p[2])) >= 0) {
            path[k++] = (char)(a * 16 + b);
            p += 2;
        } else {
            path[k++] = *p;
        }
    }
    path[k] = 0;
    if (*p || memchr(path, 0, k) != NULL)
        return api_fail(err, 400, param, "'%s': the file:// path is too long or holds a NUL byte",
                        param);
    char root[PATH_MAX], real[PATH_MAX];
    if (!realpath(allowed_dir, root))
        return api_fail(err, 500, NULL, "--allowed-media-dir %s: %s", allowed_dir, strerror(errno));
    /* the real path: "..", and symlinks anywhere on the way, are resolved */
    if (!realpath(path, real))
        return api_fail(err, 400, param, "'%s': %s: %s", param, path, strerror(errno));
    size_t rl = strlen(root);
    if (strncmp(real, root, rl) != 0 || (real[rl] != '/' && root[rl - 1] != '/'))
        return api_fail(err, 400, param, "'%s': %s is outside --allowed-media-dir %s", param, path,
                        allowed_dir);
    int fd = open(real, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0) close(fd);
        return api_fail(err, 400, param, "'%s': %s is not a readable file", param, path);
    }
    if ((size_t)st.st_size > API_MEDIA_MAX_FILE || st.st_size == 0) {
        close(fd);
        return api_fail(err, 400, param, "'%s': %s has %lld bytes; an image file holds 1 to %zu",
                        param, path, (long long)st.st_size, API_MEDIA_MAX_FILE);
    }
    uint8_t *out = malloc((size_t)st.st_size);
    size_t got = 0;
    while (out && got < (size_t)st.st_size) {
        ssize_t r = read(fd, out + got, (size_t)st.st_size - got);
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (!out || got != (size_t)st.st_size) {
        free(out);
        return api_fail(err, out ? 400 : 500, param, "'%s': %s could not be read", param, path);
    }
    *data = out;
    *len = got;
    return 0;
}

int api_media_load(const char *url, const char *allowed_dir, const char *param, uint8_t **data,
                   size_t *len, api_error *err) {
    *data = NULL;
    *len = 0;
    if (!strncasecmp(url, "data:", 5)) return load_data_url(url, param, data, len, err);
    if (!strncasecmp(url, "file://", 7))
        return load_file_url(url, allowed_dir, param, data, len, err);
    if (!strncasecmp(url, "http://", 7) || !strncasecmp(url, "https://", 8))
        return api_fail(err, 400, param, "'%s': http(s) image URLs are not fetched (the server "
                        "makes no network requests); send the image as a data: URL", param);
    return api_fail(err, 400, param, "'%s': expected a data: or file:// URL, found %.40s%s", param,
                    url, strlen(url) > 40 ? "..." : "");
}
