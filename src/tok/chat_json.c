/* chat_json.c - see chat_json.h. */
#include "chat_json.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Parser (json.loads)
 * --------------------------------------------------------------------------------------------- */

typedef struct {
    const char *s;
    size_t n, i;
    dsv4_err *err;
    int failed;
} jp;

static int jp_fail(jp *p, size_t at, const char *what) {
    if (p->failed) return -1;
    p->failed = 1;
    size_t line = 1, col = 1;
    for (size_t k = 0; k < at && k < p->n; k++) {
        if (p->s[k] == '\n') {
            line++;
            col = 1;
        } else if (((unsigned char)p->s[k] & 0xC0) != 0x80) {
            col++;
        }
    }
    return dsv4_errf(p->err, "line %zu column %zu: %s", line, col, what);
}

static void jp_ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int jp_lit(jp *p, const char *lit) {
    size_t k = strlen(lit);
    if (p->n - p->i >= k && !memcmp(p->s + p->i, lit, k)) {
        p->i += k;
        return 1;
    }
    return 0;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static void put_utf8(dsv4_sb *b, unsigned cp) {
    char u[4];
    if (cp < 0x80) {
        u[0] = (char)cp;
        dsv4_sb_put(b, u, 1);
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        dsv4_sb_put(b, u, 2);
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        dsv4_sb_put(b, u, 3);
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        dsv4_sb_put(b, u, 4);
    }
}

/* p->i is at the opening quote. Returns a malloc'd string or NULL. */
static char *jp_string(jp *p) {
    size_t start = p->i++;
    dsv4_sb b = {0};
    for (;;) {
        if (p->i >= p->n) {
            jp_fail(p, start, "unterminated string");
            goto fail;
        }
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') {
            p->i++;
            break;
        }
        if (c < 0x20) {
            jp_fail(p, p->i, "invalid control character in string");
            goto fail;
        }
        if (c != '\\') {
            size_t run = p->i;
            while (run < p->n && p->s[run] != '"' && p->s[run] != '\\' && (unsigned char)p->s[run] >= 0x20) run++;
            dsv4_sb_put(&b, p->s + p->i, run - p->i);
            p->i = run;
            continue;
        }
        if (p->i + 1 >= p->n) {
            jp_fail(p, start, "unterminated string");
            goto fail;
        }
        char e = p->s[p->i + 1];
        p->i += 2;
        switch (e) {
        case '"': dsv4_sb_putc(&b, '"'); break;
        case '\\': dsv4_sb_putc(&b, '\\'); break;
        case '/': dsv4_sb_putc(&b, '/'); break;
        case 'b': dsv4_sb_putc(&b, '\b'); break;
        case 'f': dsv4_sb_putc(&b, '\f'); break;
        case 'n': dsv4_sb_putc(&b, '\n'); break;
        case 'r': dsv4_sb_putc(&b, '\r'); break;
        case 't': dsv4_sb_putc(&b, '\t'); break;
        case 'u': {
            unsigned cp;
            if (p->n - p->i < 4 || hex4(p->s + p->i, &cp)) {
                jp_fail(p, p->i - 2, "invalid \\uXXXX escape");
                goto fail;
            }
            p->i += 4;
            if (cp == 0) {
                jp_fail(p, p->i - 6, "\\u0000 (NUL) in a string is not supported");
                goto fail;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (p->n - p->i >= 6 && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u' && !hex4(p->s + p->i + 2, &lo) &&
                    lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p->i += 6;
                } else {
                    cp = 0xFFFD; /* lone high surrogate */
                }
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                cp = 0xFFFD; /* lone low surrogate */
            }
            put_utf8(&b, cp);
            break;
        }
        default:
            jp_fail(p, p->i - 2, "invalid escape in string");
            goto fail;
        }
    }
    {
        char *s = dsv4_sb_take(&b, NULL);
        if (!s) jp_fail(p, start, "out of memory");
        return s;
    }
fail:
    dsv4_sb_free(&b);
    return NULL;
}

static cJSON *jp_number_node(jp *p, double d, const char *lex, size_t n) {
    cJSON *v = cJSON_CreateNumber(d);
    char *s = cJSON_malloc(n + 1);
    if (!v || !s) {
        cJSON_Delete(v);
        cJSON_free(s);
        jp_fail(p, p->i, "out of memory");
        return NULL;
    }
    memcpy(s, lex, n);
    s[n] = 0;
    v->valuestring = s;
    return v;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static cJSON *jp_value(jp *p, int depth);

static cJSON *jp_number(jp *p) {
    size_t st = p->i, i = p->i;
    if (i < p->n && p->s[i] == '-') i++;
    if (i >= p->n || !is_digit(p->s[i])) {
        jp_fail(p, st, "expecting value");
        return NULL;
    }
    if (p->s[i] == '0') i++;
    else
        while (i < p->n && is_digit(p->s[i])) i++;
    if (i + 1 < p->n && p->s[i] == '.' && is_digit(p->s[i + 1])) {
        i++;
        while (i < p->n && is_digit(p->s[i])) i++;
    }
    if (i < p->n && (p->s[i] == 'e' || p->s[i] == 'E')) {
        size_t j = i + 1;
        if (j < p->n && (p->s[j] == '+' || p->s[j] == '-')) j++;
        if (j < p->n && is_digit(p->s[j])) {
            while (j < p->n && is_digit(p->s[j])) j++;
            i = j;
        }
    }
    char tmp[64], *buf = tmp;
    size_t n = i - st;
    if (n >= sizeof tmp && !(buf = malloc(n + 1))) {
        jp_fail(p, st, "out of memory");
        return NULL;
    }
    memcpy(buf, p->s + st, n);
    buf[n] = 0;
    double d = strtod(buf, NULL);
    cJSON *v = jp_number_node(p, d, buf, n);
    if (buf != tmp) free(buf);
    p->i = i;
    return v;
}

static cJSON *jp_value(jp *p, int depth) {
    if (depth > 512) {
        jp_fail(p, p->i, "nesting deeper than 512 levels");
        return NULL;
    }
    jp_ws(p);
    if (p->i >= p->n) {
        jp_fail(p, p->i, "expecting value");
        return NULL;
    }
    char c = p->s[p->i];
    if (c == '"') {
        char *s = jp_string(p);
        if (!s) return NULL;
        cJSON *v = cJSON_CreateString(s);
        free(s);
        if (!v) jp_fail(p, p->i, "out of memory");
        return v;
    }
    if (c == '{') {
        size_t open = p->i++;
        cJSON *o = cJSON_CreateObject();
        if (!o) {
            jp_fail(p, open, "out of memory");
            return NULL;
        }
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == '}') {
            p->i++;
            return o;
        }
        for (;;) {
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"') {
                jp_fail(p, p->i, p->i >= p->n ? "unterminated object" : "expecting property name in double quotes");
                goto fail_o;
            }
            char *key = jp_string(p);
            if (!key) goto fail_o;
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') {
                free(key);
                jp_fail(p, p->i, "expecting ':' delimiter");
                goto fail_o;
            }
            p->i++;
            cJSON *v = jp_value(p, depth + 1);
            if (!v) {
                free(key);
                goto fail_o;
            }
            /* dict semantics: a repeated key keeps its first position, takes the last value */
            if (cJSON_GetObjectItemCaseSensitive(o, key)) cJSON_ReplaceItemInObjectCaseSensitive(o, key, v);
            else cJSON_AddItemToObject(o, key, v);
            free(key);
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == '}') {
                p->i++;
                return o;
            }
            jp_fail(p, p->i, p->i >= p->n ? "unterminated object" : "expecting ',' delimiter");
            goto fail_o;
        }
    fail_o:
        cJSON_Delete(o);
        return NULL;
    }
    if (c == '[') {
        size_t open = p->i++;
        cJSON *a = cJSON_CreateArray();
        if (!a) {
            jp_fail(p, open, "out of memory");
            return NULL;
        }
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == ']') {
            p->i++;
            return a;
        }
        for (;;) {
            cJSON *v = jp_value(p, depth + 1);
            if (!v) goto fail_a;
            cJSON_AddItemToArray(a, v);
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == ']') {
                p->i++;
                return a;
            }
            jp_fail(p, p->i, p->i >= p->n ? "unterminated array" : "expecting ',' delimiter");
            goto fail_a;
        }
    fail_a:
        cJSON_Delete(a);
        return NULL;
    }
    if (jp_lit(p, "null")) return cJSON_CreateNull();
    if (jp_lit(p, "true")) return cJSON_CreateTrue();
    if (jp_lit(p, "false")) return cJSON_CreateFalse();
    if (jp_lit(p, "NaN")) return jp_number_node(p, NAN, "NaN", 3);
    if (jp_lit(p, "Infinity")) return jp_number_node(p, INFINITY, "Infinity", 8);
    if (jp_lit(p, "-Infinity")) return jp_number_node(p, -INFINITY, "-Infinity", 9);
    return jp_number(p);
}

cJSON *dsv4_pyjson_parse(const char *text, size_t len, dsv4_err *err) {
    jp p = {.s = text ? text : "", .n = text ? len : 0, .err = err};
    cJSON *v = jp_value(&p, 0);
    if (!v) {
        if (!p.failed) dsv4_errf(err, "out of memory");
        return NULL;
    }
    jp_ws(&p);
    if (p.i < p.n) {
        jp_fail(&p, p.i, "extra data after the JSON value");
        cJSON_Delete(v);
        return NULL;
    }
    return v;
}

/* ---------------------------------------------------------------------------------------------
 * Writer (json.dumps, ensure_ascii=False)
 * --------------------------------------------------------------------------------------------- */

void dsv4_pyjson_float_repr(double d, char out[32]) {
    if (isnan(d)) {
        strcpy(out, "NaN");
        return;
    }
    if (isinf(d)) {
        strcpy(out, d < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (d == 0) {
        strcpy(out, signbit(d) ? "-0.0" : "0.0");
        return;
    }
    /* shortest digit string that reads back as d (what Python's repr prints) */
    char e[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, d);
        if (strtod(e, NULL) == d) break;
    }
    /* e = [-]D[.DDD]e[+-]XX: split into sign, digits, exponent */
    const char *q = e;
    int neg = 0;
    if (*q == '-') {
        neg = 1;
        q++;
    }
    char dig[24];
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') dig[nd++] = *q;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    dig[nd] = 0;
    int exp10 = atoi(q + 1);
    char *o = out;
    if (neg) *o++ = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) { /* 0.000ddd */
            *o++ = '0';
            *o++ = '.';
            for (int k = 0; k < -exp10 - 1; k++) *o++ = '0';
            memcpy(o, dig, (size_t)nd);
            o += nd;
        } else if (exp10 + 1 >= nd) { /* ddd000.0 */
            memcpy(o, dig, (size_t)nd);
            o += nd;
            for (int k = 0; k < exp10 + 1 - nd; k++) *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else { /* dd.ddd */
            memcpy(o, dig, (size_t)exp10 + 1);
            o += exp10 + 1;
            *o++ = '.';
            memcpy(o, dig + exp10 + 1, (size_t)(nd - exp10 - 1));
            o += nd - exp10 - 1;
        }
        *o = 0;
    } else {
        *o++ = dig[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, dig + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        int ax = exp10 < 0 ? -exp10 : exp10; /* a double's decimal exponent is at most 324 */
        *o++ = 'e';
        *o++ = exp10 < 0 ? '-' : '+';
        if (ax >= 100) *o++ = (char)('0' + ax / 100 % 10);
        *o++ = (char)('0' + ax / 10 % 10);
        *o++ = (char)('0' + ax % 10);
        *o = 0;
    }
}

static void dump_number(dsv4_sb *b, const cJSON *v) {
    char buf[40];
    const char *lex = v->valuestring;
    if (lex && *lex) {
        int is_float = strpbrk(lex, ".eEIN") != NULL; /* IN: Infinity, NaN */
        if (!is_float) {
            dsv4_sb_puts(b, strcmp(lex, "-0") ? lex : "0");
            return;
        }
        dsv4_pyjson_float_repr(v->valuedouble, buf);
        dsv4_sb_puts(b, buf);
        return;
    }
    double d = v->valuedouble;
    if (isfinite(d) && d == floor(d) && fabs(d) < 1e16) {
        snprintf(buf, sizeof buf, "%.0f", d == 0 ? 0.0 : d);
        dsv4_sb_puts(b, buf);
        return;
    }
    dsv4_pyjson_float_repr(d, buf);
    dsv4_sb_puts(b, buf);
}

/* Length of the valid UTF-8 character at s[0..n), 0 if invalid. */
static size_t utf8_char_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned cp, min;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

void dsv4_pyjson_dump_string(dsv4_sb *b, const char *s, size_t n, int flags) {
    static const char hexd[] = "0123456789abcdef";
    dsv4_sb_putc(b, '"');
    size_t run = 0; /* start of the pending run of bytes copied as they are */
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[7];
        size_t skip = 1;
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                u[0] = '\\', u[1] = 'u', u[2] = '0', u[3] = '0', u[4] = hexd[c >> 4], u[5] = hexd[c & 15], u[6] = 0;
                esc = u;
            } else if (c >= 0x80 && (flags & DSV4_PYJSON_FIX_UTF8)) {
                size_t l = utf8_char_len((const unsigned char *)s + i, n - i);
                if (l) skip = l;
                else esc = "\xEF\xBF\xBD"; /* U+FFFD */
            }
        }
        if (esc) {
            dsv4_sb_put(b, s + run, i - run);
            dsv4_sb_puts(b, esc);
            i += 1;
            run = i;
        } else {
            i += skip;
        }
    }
    dsv4_sb_put(b, s + run, n - run);
    dsv4_sb_putc(b, '"');
}

int dsv4_pyjson_first_of_key(const cJSON *object, const cJSON *item, const cJSON **value) {
    *value = item;
    if (!item->string) return 1;
    for (const cJSON *c = object->child; c && c != item; c = c->next)
        if (c->string && !strcmp(c->string, item->string)) return 0;
    for (const cJSON *c = item->next; c; c = c->next)
        if (c->string && !strcmp(c->string, item->string)) *value = c;
    return 1;
}

static void dump_value(dsv4_sb *b, const cJSON *v, int flags, int depth) {
    const char *comma = (flags & DSV4_PYJSON_COMPACT) ? "," : ", ";
    const char *colon = (flags & DSV4_PYJSON_COMPACT) ? ":" : ": ";
    if (!v || depth > 1000) {
        dsv4_sb_puts(b, "null");
        return;
    }
    switch (v->type & 0xFF) {
    case cJSON_False: dsv4_sb_puts(b, "false"); break;
    case cJSON_True: dsv4_sb_puts(b, "true"); break;
    case cJSON_Number: dump_number(b, v); break;
    case cJSON_String:
        dsv4_pyjson_dump_string(b, v->valuestring ? v->valuestring : "", v->valuestring ? strlen(v->valuestring) : 0, flags);
        break;
    case cJSON_Raw: dsv4_sb_puts(b, v->valuestring ? v->valuestring : "null"); break;
    case cJSON_Array:
        dsv4_sb_putc(b, '[');
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child) dsv4_sb_puts(b, comma);
            dump_value(b, c, flags, depth + 1);
        }
        dsv4_sb_putc(b, ']');
        break;
    case cJSON_Object: {
        dsv4_sb_putc(b, '{');
        int first = 1;
        for (const cJSON *c = v->child; c; c = c->next) {
            const cJSON *val;
            if (!dsv4_pyjson_first_of_key(v, c, &val)) continue;
            if (!first) dsv4_sb_puts(b, comma);
            first = 0;
            const char *k = c->string ? c->string : "";
            dsv4_pyjson_dump_string(b, k, strlen(k), flags);
            dsv4_sb_puts(b, colon);
            dump_value(b, val, flags, depth + 1);
        }
        dsv4_sb_putc(b, '}');
        break;
    }
    default: dsv4_sb_puts(b, "null"); break; /* cJSON_NULL, cJSON_Invalid */
    }
}

void dsv4_pyjson_dump(dsv4_sb *b, const cJSON *v, int flags) { dump_value(b, v, flags, 0); }

int dsv4_pyjson_truthy(const cJSON *v) {
    if (!v) return 0;
    switch (v->type & 0xFF) {
    case cJSON_True: return 1;
    case cJSON_Number: return v->valuedouble != 0 || isnan(v->valuedouble);
    case cJSON_String:
    case cJSON_Raw: return v->valuestring && *v->valuestring;
    case cJSON_Array:
    case cJSON_Object: return v->child != NULL;
    default: return 0;
    }
}

size_t dsv4_utf8_complete_prefix(const char *s, size_t n) {
    if (!n) return 0;
    size_t i = n - 1;
    while (i > 0 && n - i < 4 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    unsigned char c = (unsigned char)s[i];
    size_t want = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return n - i < want ? i : n;
}
