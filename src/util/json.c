/* json.c - see json.h. */
#include "json.h"

const char *dsv4_json_kind(const cJSON *j) {
    if (!j) return "missing";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "invalid";
}
