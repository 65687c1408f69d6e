/* json_field: see json_field.h. */
#include "serve/json_field.h"

const cJSON *json_get(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

void json_copy(const cJSON *in, cJSON *out, const char *k, const char *as) {
    const cJSON *v = json_get(in, k);
    if (v) cJSON_AddItemToObject(out, as ? as : k, cJSON_Duplicate(v, 1));
}

cJSON *json_message(const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    return m;
}
