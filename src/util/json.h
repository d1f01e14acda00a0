/* json.h - small helpers over cJSON values shared by the loaders (config, safetensors, tokenizer). */
#ifndef DSV4_UTIL_JSON_H
#define DSV4_UTIL_JSON_H

#include <cjson/cJSON.h>

/* What a value is, for messages: "missing" (NULL), "null", "a boolean", "a number", "a string",
 * "an array", "an object" ("invalid" for anything else). */
const char *dsv4_json_kind(const cJSON *j);

#endif
