/* Strict JSON parser.  One pass over the text with an explicit stack of open
 * containers (no recursion): finished values wait on a value stack (and keys
 * on a key stack) until their container closes, when they are copied into
 * one contiguous array.  Strings, arrays and objects live in an arena freed
 * with the root.  Objects of more than SMALL_OBJECT members get an
 * open-addressing index, which also finds duplicate keys in linear time. */
#include "util/json.h"

#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

#define SMALL_OBJECT 8

struct member;

struct refit_json {
    refit_json_type_t type;
    bool boolean;
    bool is_int;
    union {
        struct {
            int64_t i;
            double d;
        } num;
        struct {
            const char *s;
            size_t len;
        } str;
        struct {
            refit_json_t *items;
            size_t len;
        } arr;
        struct {
            struct member *members;
            size_t len;
            size_t *slots; /* member index + 1, 0 = empty; NULL for small objects */
            size_t mask;
        } obj;
    } u;
};

struct member {
    const char *key;
    size_t key_len;
    refit_json_t value;
};

/* ---- arena ---------------------------------------------------------------- */

typedef struct block {
    struct block *next;
    size_t used, cap;
} block_t;

#define ARENA_ALIGN ((size_t) _Alignof(max_align_t))
#define BLOCK_HDR ((sizeof(block_t) + ARENA_ALIGN - 1) & ~(ARENA_ALIGN - 1))
#define BLOCK_MIN ((size_t)4096)
#define BLOCK_MAX ((size_t)1 << 20)

typedef struct {
    block_t *head; /* the block being filled */
    size_t next_cap;
} arena_t;

static size_t round_up(size_t n) { return (n + ARENA_ALIGN - 1) & ~(ARENA_ALIGN - 1); }

static void *arena_alloc(arena_t *a, size_t size)
{
    if (size > SIZE_MAX - ARENA_ALIGN - BLOCK_HDR) return NULL;
    size = round_up(size);
    block_t *b = a->head;
    if (b && b->cap - b->used >= size) {
        void *p = (char *)b + BLOCK_HDR + b->used;
        b->used += size;
        return p;
    }
    if (size >= a->next_cap) {
        /* A large allocation gets a block of its own, kept behind the block
         * being filled so that block's free space is not lost. */
        block_t *big = malloc(BLOCK_HDR + size);
        if (!big) return NULL;
        big->used = big->cap = size;
        if (b) {
            big->next = b->next;
            b->next = big;
        } else {
            big->next = NULL;
            a->head = big;
        }
        return (char *)big + BLOCK_HDR;
    }
    b = malloc(BLOCK_HDR + a->next_cap);
    if (!b) return NULL;
    b->cap = a->next_cap;
    b->used = size;
    b->next = a->head;
    a->head = b;
    if (a->next_cap < BLOCK_MAX) a->next_cap *= 2;
    return (char *)b + BLOCK_HDR;
}

/* Gives back the tail of the latest allocation p (of old bytes) beyond new. */
static void arena_trim(arena_t *a, void *p, size_t old_size, size_t new_size)
{
    block_t *b = a->head;
    if (b && (char *)p + round_up(old_size) == (char *)b + BLOCK_HDR + b->used)
        b->used -= round_up(old_size) - round_up(new_size);
}

static void arena_free(arena_t *a)
{
    for (block_t *b = a->head, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    a->head = NULL;
}

typedef struct {
    refit_json_t root; /* first: a root pointer is a doc pointer */
    arena_t arena;
} doc_t;

/* ---- numbers read in the C locale ----------------------------------------- */

static pthread_once_t g_locale_once = PTHREAD_ONCE_INIT;
static locale_t g_c_locale;

static void init_c_locale(void) { g_c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0); }

/* ---- parser --------------------------------------------------------------- */

typedef struct {
    const char *s;
    size_t len;
    size_t off; /* where the key starts in the text, for messages */
} pkey_t;

typedef struct {
    bool is_obj;
    size_t first_value, first_key;
} frame_t;

typedef struct {
    const char *text;
    size_t len, pos;
    arena_t *arena;
    REFIT_VEC(refit_json_t) values;
    REFIT_VEC(pkey_t) keys;
    REFIT_VEC(frame_t) frames;
    REFIT_VEC(char) scratch;
} parser_t;

static refit_status_t perr(const parser_t *p, size_t off, const char *fmt, ...) REFIT_PRINTF(3, 4);

static refit_status_t perr(const parser_t *p, size_t off, const char *fmt, ...)
{
    size_t line = 1, col = 1;
    for (size_t i = 0; i < off && i < p->len; i++) {
        unsigned char c = (unsigned char)p->text[i];
        if (c == '\n') {
            line++;
            col = 1;
        } else if ((c & 0xC0) != 0x80) { /* count characters, not continuation bytes */
            col++;
        }
    }
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return refit_error(REFIT_ERR_PARSE, "line %zu column %zu: %s", line, col, what);
}

static refit_status_t no_memory(void) { return refit_error(REFIT_ERR_NO_MEMORY, "parsing JSON"); }

/* "unexpected X, expected <expected>" at the current position. */
static refit_status_t unexpected(const parser_t *p, const char *expected)
{
    if (p->pos >= p->len) return perr(p, p->pos, "unexpected end of input, expected %s", expected);
    unsigned char c = (unsigned char)p->text[p->pos];
    if (c > 0x20 && c < 0x7f) return perr(p, p->pos, "unexpected '%c', expected %s", c, expected);
    return perr(p, p->pos, "unexpected byte 0x%02x, expected %s", c, expected);
}

static void skip_ws(parser_t *p)
{
    while (p->pos < p->len) {
        char c = p->text[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static int hex4(const char *s)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Length of the well-formed UTF-8 sequence at s (avail bytes), 0 if none
 * (overlong forms, surrogates and code points above U+10FFFF are not). */
static size_t utf8_seq(const unsigned char *s, size_t avail)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xBF;
    size_t n;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return 0;
    if (avail < n || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return n;
}

static size_t utf8_put(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string at p->pos (its opening quote), decoded into the arena. */
static refit_status_t parse_string(parser_t *p, const char **out, size_t *out_len)
{
    const char *t = p->text;
    const size_t open = p->pos, start = open + 1;
    size_t end = start; /* the closing quote */
    while (end < p->len && t[end] != '"') end += t[end] == '\\' ? 2 : 1;
    if (end >= p->len) return perr(p, open, "unterminated string");
    /* Decoding never lengthens: an escape of 2, 6 or 12 bytes gives 1 to 4. */
    const size_t raw = end - start;
    char *buf = arena_alloc(p->arena, raw + 1);
    if (!buf) return no_memory();
    size_t i = start, o = 0;
    while (i < end) {
        unsigned char c = (unsigned char)t[i];
        if (c == '\\') { /* the scan above stepped over t[i + 1], so i + 1 < end */
            char e = t[i + 1];
            switch (e) {
            case '"':
            case '\\':
            case '/':
                buf[o++] = e;
                i += 2;
                continue;
            case 'b':
                buf[o++] = '\b';
                i += 2;
                continue;
            case 'f':
                buf[o++] = '\f';
                i += 2;
                continue;
            case 'n':
                buf[o++] = '\n';
                i += 2;
                continue;
            case 'r':
                buf[o++] = '\r';
                i += 2;
                continue;
            case 't':
                buf[o++] = '\t';
                i += 2;
                continue;
            case 'u': break;
            default:
                if ((unsigned char)e > 0x20 && (unsigned char)e < 0x7f)
                    return perr(p, i, "invalid escape '\\%c' in string", e);
                return perr(p, i, "invalid escape in string (byte 0x%02x after '\\')", (unsigned char)e);
            }
            int cp = end - i >= 6 ? hex4(t + i + 2) : -1;
            if (cp < 0) return perr(p, i, "invalid \\u escape (needs four hex digits)");
            if (cp >= 0xDC00 && cp <= 0xDFFF) return perr(p, i, "unpaired low surrogate \\u%04X", (unsigned)cp);
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                int lo = end - i >= 12 && t[i + 6] == '\\' && t[i + 7] == 'u' ? hex4(t + i + 8) : -1;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return perr(p, i, "high surrogate \\u%04X not followed by a low surrogate", (unsigned)cp);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                i += 6;
            }
            o += utf8_put(buf + o, (uint32_t)cp);
            i += 6;
        } else if (c < 0x20) {
            return perr(p, i, "control character U+%04X in string (must be escaped)", c);
        } else {
            size_t n = utf8_seq((const unsigned char *)t + i, end - i);
            if (!n) return perr(p, i, "invalid UTF-8 in string (byte 0x%02x)", c);
            memcpy(buf + o, t + i, n);
            o += n;
            i += n;
        }
    }
    buf[o] = '\0';
    arena_trim(p->arena, buf, raw + 1, o + 1);
    p->pos = end + 1;
    *out = buf;
    *out_len = o;
    return REFIT_OK;
}

static refit_status_t parse_number(parser_t *p, refit_json_t *v)
{
    const char *t = p->text;
    const size_t start = p->pos;
    size_t i = start;
    bool neg = false, integral = true;
    if (t[i] == '-') neg = true, i++;
    if (i >= p->len || !is_digit(t[i])) return perr(p, i, neg ? "'-' without digits" : "expected a digit");
    if (t[i] == '0') {
        i++;
        if (i < p->len && is_digit(t[i])) return perr(p, start, "number with a leading zero");
    } else {
        while (i < p->len && is_digit(t[i])) i++;
    }
    if (i < p->len && t[i] == '.') {
        integral = false;
        i++;
        if (i >= p->len || !is_digit(t[i])) return perr(p, i, "expected a digit after the decimal point");
        while (i < p->len && is_digit(t[i])) i++;
    }
    if (i < p->len && (t[i] == 'e' || t[i] == 'E')) {
        integral = false;
        i++;
        if (i < p->len && (t[i] == '+' || t[i] == '-')) i++;
        if (i >= p->len || !is_digit(t[i])) return perr(p, i, "expected a digit in the exponent");
        while (i < p->len && is_digit(t[i])) i++;
    }
    const size_t n = i - start;
    if (REFIT_VEC_RESERVE(&p->scratch, n + 1)) return no_memory();
    memcpy(p->scratch.data, t + start, n);
    p->scratch.data[n] = '\0';
    double d = strtod_l(p->scratch.data, NULL, g_c_locale);
    if (isinf(d)) return perr(p, start, "number out of range of a double");
    *v = (refit_json_t){.type = REFIT_JSON_NUMBER, .u.num.d = d};
    if (integral) {
        uint64_t mag = 0;
        bool fits = true;
        for (size_t k = start + neg; k < i && fits; k++)
            fits = refit_mul_u64(mag, 10, &mag) && refit_add_u64(mag, (uint64_t)(t[k] - '0'), &mag);
        const uint64_t limit = (uint64_t)INT64_MAX + (neg ? 1 : 0);
        if (fits && mag <= limit) {
            v->is_int = true;
            v->u.num.i = !neg ? (int64_t)mag : mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag;
        }
    }
    p->pos = i;
    return REFIT_OK;
}

static bool take_literal(parser_t *p, const char *word)
{
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->text + p->pos, word, n) != 0) return false;
    p->pos += n;
    return true;
}

/* A key and its colon; p->pos is past leading whitespace. */
static refit_status_t parse_key(parser_t *p)
{
    if (p->pos >= p->len || p->text[p->pos] != '"') return unexpected(p, "a string key");
    pkey_t k = {.off = p->pos};
    refit_status_t st = parse_string(p, &k.s, &k.len);
    if (st) return st;
    if (REFIT_VEC_PUSH(&p->keys, k)) return no_memory();
    skip_ws(p);
    if (p->pos >= p->len || p->text[p->pos] != ':') return unexpected(p, "':'");
    p->pos++;
    return REFIT_OK;
}

static bool key_eq(const struct member *m, const char *key, size_t len)
{
    return m->key_len == len && memcmp(m->key, key, len) == 0;
}

static size_t key_hash(const char *key, size_t len) { return (size_t)refit_hash64(key, len, 0x15011); }

static refit_status_t duplicate_key(const parser_t *p, const pkey_t *k)
{
    char shown[48];
    size_t n = 0;
    for (size_t i = 0; i < k->len && n + 1 < sizeof(shown); i++) {
        unsigned char c = (unsigned char)k->s[i];
        shown[n++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    shown[n] = '\0';
    return perr(p, k->off, "duplicate key \"%s%s\"", shown, n < k->len ? "..." : "");
}

/* Closes the innermost container: its values (and keys) leave the stacks for
 * one array in the arena, and *v becomes the container. */
static refit_status_t close_container(parser_t *p, refit_json_t *v)
{
    const frame_t f = p->frames.data[p->frames.len - 1];
    const size_t n = p->values.len - f.first_value;
    /* (the stacks may still be unallocated: no arithmetic on NULL) */
    const refit_json_t *vals = n ? p->values.data + f.first_value : NULL;
    if (!f.is_obj) {
        refit_json_t *items = NULL;
        if (n) {
            if (n > SIZE_MAX / sizeof(*items) || !(items = arena_alloc(p->arena, n * sizeof(*items))))
                return no_memory();
            memcpy(items, vals, n * sizeof(*items));
        }
        *v = (refit_json_t){.type = REFIT_JSON_ARRAY, .u.arr = {items, n}};
    } else {
        const pkey_t *keys = n ? p->keys.data + f.first_key : NULL;
        struct member *mem = NULL;
        size_t *slots = NULL, mask = 0;
        if (n) {
            if (n > SIZE_MAX / sizeof(*mem) || !(mem = arena_alloc(p->arena, n * sizeof(*mem)))) return no_memory();
            for (size_t k = 0; k < n; k++) mem[k] = (struct member){keys[k].s, keys[k].len, vals[k]};
        }
        if (n <= SMALL_OBJECT) {
            for (size_t k = 1; k < n; k++)
                for (size_t j = 0; j < k; j++)
                    if (key_eq(&mem[j], keys[k].s, keys[k].len)) return duplicate_key(p, &keys[k]);
        } else {
            size_t cap = 16;
            while (cap < 2 * n) cap *= 2; /* n <= SIZE_MAX / sizeof(*mem): no overflow */
            if (!(slots = arena_alloc(p->arena, cap * sizeof(*slots)))) return no_memory();
            memset(slots, 0, cap * sizeof(*slots));
            mask = cap - 1;
            for (size_t k = 0; k < n; k++) {
                size_t s = key_hash(keys[k].s, keys[k].len) & mask;
                for (; slots[s]; s = (s + 1) & mask)
                    if (key_eq(&mem[slots[s] - 1], keys[k].s, keys[k].len)) return duplicate_key(p, &keys[k]);
                slots[s] = k + 1;
            }
        }
        *v = (refit_json_t){.type = REFIT_JSON_OBJECT, .u.obj = {mem, n, slots, mask}};
        p->keys.len = f.first_key;
    }
    p->values.len = f.first_value;
    p->frames.len--;
    return REFIT_OK;
}

/* Starts a value at p->pos: a scalar or an empty container sets *done and *v;
 * an opening bracket with content pushes a frame (and an object's first key)
 * and leaves *done false. */
static refit_status_t begin_value(parser_t *p, refit_json_t *v, bool *done)
{
    skip_ws(p);
    if (p->pos >= p->len) return unexpected(p, "a value");
    const char c = p->text[p->pos];
    *done = true;
    if (c == '{' || c == '[') {
        if (p->frames.len >= REFIT_JSON_MAX_DEPTH)
            return perr(p, p->pos, "nesting deeper than %d arrays and objects", REFIT_JSON_MAX_DEPTH);
        frame_t f = {c == '{', p->values.len, p->keys.len};
        if (REFIT_VEC_PUSH(&p->frames, f)) return no_memory();
        p->pos++;
        skip_ws(p);
        if (p->pos < p->len && p->text[p->pos] == (c == '{' ? '}' : ']')) {
            p->pos++;
            return close_container(p, v);
        }
        *done = false;
        return c == '{' ? parse_key(p) : REFIT_OK;
    }
    if (c == '"') {
        *v = (refit_json_t){.type = REFIT_JSON_STRING};
        return parse_string(p, &v->u.str.s, &v->u.str.len);
    }
    if (c == '-' || is_digit(c)) return parse_number(p, v);
    if (take_literal(p, "true")) *v = (refit_json_t){.type = REFIT_JSON_BOOL, .boolean = true};
    else if (take_literal(p, "false")) *v = (refit_json_t){.type = REFIT_JSON_BOOL};
    else if (take_literal(p, "null")) *v = (refit_json_t){.type = REFIT_JSON_NULL};
    else return unexpected(p, "a value");
    return REFIT_OK;
}

static refit_status_t parse_text(parser_t *p, refit_json_t *root)
{
    refit_status_t st;
    if (p->len >= 3 && memcmp(p->text, "\xEF\xBB\xBF", 3) == 0) p->pos = 3;
    for (;;) {
        refit_json_t v;
        bool done = false;
        if ((st = begin_value(p, &v, &done))) return st;
        if (!done) continue;
        /* v is complete: hand it to the enclosing containers, closing those
         * that end here, until one wants another value. */
        for (;;) {
            if (p->frames.len == 0) {
                skip_ws(p);
                if (p->pos < p->len) return unexpected(p, "the end of input after the value");
                *root = v;
                return REFIT_OK;
            }
            if (REFIT_VEC_PUSH(&p->values, v)) return no_memory();
            const bool is_obj = p->frames.data[p->frames.len - 1].is_obj;
            skip_ws(p);
            if (p->pos < p->len && p->text[p->pos] == ',') {
                p->pos++;
                if (is_obj) {
                    skip_ws(p);
                    if ((st = parse_key(p))) return st;
                }
                break;
            }
            if (p->pos < p->len && p->text[p->pos] == (is_obj ? '}' : ']')) {
                p->pos++;
                if ((st = close_container(p, &v))) return st;
                continue;
            }
            return unexpected(p, is_obj ? "',' or '}'" : "',' or ']'");
        }
    }
}

refit_status_t refit_json_parse(const char *text, size_t len, refit_json_t **out)
{
    refit_status_t st;
    if (!out || (!text && len)) return refit_error(REFIT_ERR_INVALID_ARG, "refit_json_parse: NULL argument");
    pthread_once(&g_locale_once, init_c_locale);
    if (!g_c_locale) return refit_error(REFIT_ERR_NO_MEMORY, "creating the C locale for reading numbers");
    doc_t *doc = calloc(1, sizeof(*doc));
    if (!doc) return no_memory();
    doc->arena.next_cap = BLOCK_MIN;
    parser_t p = {.text = text ? text : "", .len = len, .arena = &doc->arena};
    st = parse_text(&p, &doc->root);
    REFIT_VEC_FREE(&p.values);
    REFIT_VEC_FREE(&p.keys);
    REFIT_VEC_FREE(&p.frames);
    REFIT_VEC_FREE(&p.scratch);
    if (st) goto err_doc;
    *out = &doc->root;
    return REFIT_OK;
err_doc:
    refit_json_free(&doc->root);
    return st;
}

void refit_json_free(refit_json_t *root)
{
    if (!root) return;
    doc_t *doc = (doc_t *)root;
    arena_free(&doc->arena);
    free(doc);
}

/* ---- accessors ------------------------------------------------------------ */

refit_json_type_t refit_json_type(const refit_json_t *v) { return v ? v->type : REFIT_JSON_NONE; }

const char *refit_json_type_name(refit_json_type_t type)
{
    switch (type) {
    case REFIT_JSON_NULL: return "null";
    case REFIT_JSON_BOOL: return "boolean";
    case REFIT_JSON_NUMBER: return "number";
    case REFIT_JSON_STRING: return "string";
    case REFIT_JSON_ARRAY: return "array";
    case REFIT_JSON_OBJECT: return "object";
    case REFIT_JSON_NONE: break;
    }
    return "missing";
}

bool refit_json_bool(const refit_json_t *v, bool *out)
{
    if (!v || v->type != REFIT_JSON_BOOL) return false;
    *out = v->boolean;
    return true;
}

bool refit_json_int(const refit_json_t *v, int64_t *out)
{
    if (!v || v->type != REFIT_JSON_NUMBER || !v->is_int) return false;
    *out = v->u.num.i;
    return true;
}

bool refit_json_double(const refit_json_t *v, double *out)
{
    if (!v || v->type != REFIT_JSON_NUMBER) return false;
    *out = v->u.num.d;
    return true;
}

const char *refit_json_string(const refit_json_t *v, size_t *len)
{
    if (!v || v->type != REFIT_JSON_STRING) return NULL;
    if (len) *len = v->u.str.len;
    return v->u.str.s;
}

size_t refit_json_len(const refit_json_t *v)
{
    if (!v) return 0;
    if (v->type == REFIT_JSON_ARRAY) return v->u.arr.len;
    if (v->type == REFIT_JSON_OBJECT) return v->u.obj.len;
    return 0;
}

const refit_json_t *refit_json_at(const refit_json_t *v, size_t i)
{
    if (v && v->type == REFIT_JSON_ARRAY && i < v->u.arr.len) return &v->u.arr.items[i];
    if (v && v->type == REFIT_JSON_OBJECT && i < v->u.obj.len) return &v->u.obj.members[i].value;
    return NULL;
}

const char *refit_json_key(const refit_json_t *obj, size_t i, size_t *len)
{
    if (!obj || obj->type != REFIT_JSON_OBJECT || i >= obj->u.obj.len) return NULL;
    if (len) *len = obj->u.obj.members[i].key_len;
    return obj->u.obj.members[i].key;
}

const refit_json_t *refit_json_get(const refit_json_t *obj, const char *key)
{
    if (!obj || !key || obj->type != REFIT_JSON_OBJECT) return NULL;
    const size_t len = strlen(key);
    const struct member *mem = obj->u.obj.members;
    if (!obj->u.obj.slots) {
        for (size_t k = 0; k < obj->u.obj.len; k++)
            if (key_eq(&mem[k], key, len)) return &mem[k].value;
        return NULL;
    }
    const size_t mask = obj->u.obj.mask;
    for (size_t s = key_hash(key, len) & mask; obj->u.obj.slots[s]; s = (s + 1) & mask)
        if (key_eq(&mem[obj->u.obj.slots[s] - 1], key, len)) return &mem[obj->u.obj.slots[s] - 1].value;
    return NULL;
}
