/* The strict JSON parser: values, escapes and Unicode, numbers, containers,
 * lookups, and a list of malformed texts each refused with a located error. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/json.h"

static refit_json_t *parse_ok(const char *text)
{
    refit_json_t *root = NULL;
    REFIT_ASSERT_OK(refit_json_parse(text, strlen(text), &root));
    assert_non_null(root);
    return root;
}

static void test_scalars(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        refit_json_type_t type;
    } cases[] = {
        {"null", REFIT_JSON_NULL}, {"true", REFIT_JSON_BOOL},           {"false", REFIT_JSON_BOOL},
        {"0", REFIT_JSON_NUMBER},  {"\"\"", REFIT_JSON_STRING},         {"[]", REFIT_JSON_ARRAY},
        {"{}", REFIT_JSON_OBJECT}, {" \t\r\n 7 \n", REFIT_JSON_NUMBER},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        refit_json_t *v = parse_ok(cases[i].text);
        assert_int_equal(refit_json_type(v), cases[i].type);
        refit_json_free(v);
    }
    refit_json_t *v = parse_ok("true");
    bool b = false;
    int64_t i;
    double d;
    assert_true(refit_json_bool(v, &b));
    assert_true(b);
    assert_false(refit_json_int(v, &i));
    assert_false(refit_json_double(v, &d));
    assert_null(refit_json_string(v, NULL));
    assert_int_equal(refit_json_len(v), 0);
    assert_null(refit_json_at(v, 0));
    assert_null(refit_json_get(v, "x"));
    refit_json_free(v);
    /* NULL is a missing value everywhere. */
    assert_int_equal(refit_json_type(NULL), REFIT_JSON_NONE);
    assert_string_equal(refit_json_type_name(REFIT_JSON_NONE), "missing");
    assert_string_equal(refit_json_type_name(REFIT_JSON_OBJECT), "object");
    assert_false(refit_json_bool(NULL, &b));
    assert_false(refit_json_int(NULL, &i));
    assert_null(refit_json_key(NULL, 0, NULL));
    refit_json_free(NULL);
    /* A leading byte order mark is skipped. */
    v = parse_ok("\xEF\xBB\xBF[1]");
    assert_int_equal(refit_json_len(v), 1);
    refit_json_free(v);
}

static void test_numbers(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        bool is_int;
        int64_t i;
        double d;
    } cases[] = {
        {"0", true, 0, 0.0},
        {"-0", true, 0, -0.0},
        {"42", true, 42, 42.0},
        {"-17", true, -17, -17.0},
        {"9223372036854775807", true, INT64_MAX, 9223372036854775807.0},
        {"-9223372036854775808", true, INT64_MIN, -9223372036854775808.0},
        {"9007199254740993", true, 9007199254740993LL, 9007199254740992.0}, /* 2^53 + 1: exact as int only */
        {"9223372036854775808", false, 0, 9223372036854775808.0},           /* 2^63: double only */
        {"-9223372036854775809", false, 0, -9223372036854775808.0},
        {"123456789012345678901234567890", false, 0, 123456789012345678901234567890.0},
        {"1.5", false, 0, 1.5},
        {"2.0", false, 0, 2.0},
        {"-0.25", false, 0, -0.25},
        {"1e3", false, 0, 1000.0},
        {"1E+2", false, 0, 100.0},
        {"-1.25e-2", false, 0, -0.0125},
        {"0e0", false, 0, 0.0},
        {"1e-400", false, 0, 0.0}, /* underflows to zero, which is allowed */
        {"1.7976931348623157e308", false, 0, 1.7976931348623157e308},
        {"0.1", false, 0, 0.1},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        refit_json_t *v = parse_ok(cases[k].text);
        int64_t i = 12345;
        double d = -1;
        assert_int_equal(refit_json_type(v), REFIT_JSON_NUMBER);
        if (refit_json_int(v, &i) != cases[k].is_int) fail_msg("%s: int-ness", cases[k].text);
        if (cases[k].is_int && i != cases[k].i) fail_msg("%s: int %lld", cases[k].text, (long long)i);
        assert_true(refit_json_double(v, &d));
        if (d != cases[k].d) fail_msg("%s: double %.17g", cases[k].text, d);
        refit_json_free(v);
    }
    /* -0 keeps its sign as a double. */
    refit_json_t *v = parse_ok("-0.0");
    double d;
    assert_true(refit_json_double(v, &d));
    assert_true(signbit(d));
    refit_json_free(v);
}

static void check_string(const char *text, const char *want, size_t want_len)
{
    refit_json_t *v = parse_ok(text);
    size_t len = 999;
    const char *s = refit_json_string(v, &len);
    assert_non_null(s);
    if (len != want_len || memcmp(s, want, len) != 0) fail_msg("%s: decoded %zu bytes, want %zu", text, len, want_len);
    assert_int_equal(s[len], '\0');
    refit_json_free(v);
}

static void test_strings(void **state)
{
    (void)state;
    check_string("\"\"", "", 0);
    check_string("\"plain ascii\"", "plain ascii", 11);
    check_string("\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\"", "\" \\ / \b \f \n \r \t", 15);
    check_string("\"\\u0041\\u00e9\\u20AC\"", "A\xC3\xA9\xE2\x82\xAC", 6); /* A é € */
    check_string("\"\\uD83D\\uDE00\"", "\xF0\x9F\x98\x80", 4);             /* 😀 from a surrogate pair */
    check_string("\"\\udbff\\udfff\"", "\xF4\x8F\xBF\xBF", 4);             /* U+10FFFF */
    check_string("\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"", "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", 9); /* raw UTF-8 */
    check_string("\"\\u07FF\\u0800\\uFFFF\"", "\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF", 8); /* encoding boundaries */
    check_string("\"a\\u0000b\"", "a\0b", 3); /* embedded NUL keeps its length */
    check_string("\"\x7f\"", "\x7f", 1);      /* DEL is not a control char in JSON */
}

static void test_containers(void **state)
{
    (void)state;
    refit_json_t *root = parse_ok("{\"z\": 1, \"a\": [true, null, \"s\", [], {}], \"m\": {\"k\": -2.5}, \"\": 0}");
    assert_int_equal(refit_json_type(root), REFIT_JSON_OBJECT);
    assert_int_equal(refit_json_len(root), 4);
    /* Document order is kept. */
    static const char *const order[] = {"z", "a", "m", ""};
    for (size_t i = 0; i < 4; i++) {
        size_t len;
        assert_string_equal(refit_json_key(root, i, &len), order[i]);
        assert_int_equal(len, strlen(order[i]));
        assert_ptr_equal(refit_json_at(root, i), refit_json_get(root, order[i]));
    }
    assert_null(refit_json_key(root, 4, NULL));
    assert_null(refit_json_at(root, 4));
    assert_null(refit_json_get(root, "missing"));
    const refit_json_t *a = refit_json_get(root, "a");
    assert_int_equal(refit_json_type(a), REFIT_JSON_ARRAY);
    assert_int_equal(refit_json_len(a), 5);
    assert_int_equal(refit_json_type(refit_json_at(a, 1)), REFIT_JSON_NULL);
    assert_string_equal(refit_json_string(refit_json_at(a, 2), NULL), "s");
    assert_int_equal(refit_json_type(refit_json_at(a, 3)), REFIT_JSON_ARRAY);
    assert_int_equal(refit_json_type(refit_json_at(a, 4)), REFIT_JSON_OBJECT);
    assert_null(refit_json_at(a, 5));
    assert_null(refit_json_get(a, "x"));
    assert_null(refit_json_key(a, 0, NULL));
    double d;
    assert_true(refit_json_double(refit_json_get(refit_json_get(root, "m"), "k"), &d));
    assert_true(d == -2.5);
    int64_t i;
    assert_false(refit_json_int(refit_json_get(refit_json_get(root, "nope"), "k"), &i));
    refit_json_free(root);
}

/* A safetensors header: offsets beyond 2^53 must stay exact. */
static void test_safetensors_header(void **state)
{
    (void)state;
    const char *text = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[151936,2048],"
                       "\"data_offsets\":[0,622329856]},"
                       "\"lm_head.weight\":{\"dtype\":\"BF16\",\"shape\":[151936,2048],"
                       "\"data_offsets\":[9007199254740993,9223372036854775807]}}";
    refit_json_t *root = parse_ok(text);
    const refit_json_t *t = refit_json_get(root, "lm_head.weight");
    const refit_json_t *off = refit_json_get(t, "data_offsets");
    int64_t lo, hi, dim;
    assert_true(refit_json_int(refit_json_at(off, 0), &lo));
    assert_true(refit_json_int(refit_json_at(off, 1), &hi));
    assert_true(lo == 9007199254740993LL);
    assert_true(hi == INT64_MAX);
    assert_true(refit_json_int(
        refit_json_at(refit_json_get(refit_json_get(root, "model.embed_tokens.weight"), "shape"), 0), &dim));
    assert_int_equal(dim, 151936);
    assert_string_equal(refit_json_string(refit_json_get(t, "dtype"), NULL), "BF16");
    refit_json_free(root);
}

/* Objects large enough to be hashed: every key found, duplicates refused. */
static void test_large_object(void **state)
{
    (void)state;
    const size_t n = 5000;
    size_t cap = n * 32 + 16, pos = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    text[pos++] = '{';
    for (size_t i = 0; i < n; i++)
        pos += (size_t)snprintf(text + pos, cap - pos, "%s\"model.layers.%zu.w\":%zu", i ? "," : "", i, i * 3);
    text[pos++] = '}';
    refit_json_t *root;
    REFIT_ASSERT_OK(refit_json_parse(text, pos, &root));
    assert_int_equal(refit_json_len(root), n);
    for (size_t i = 0; i < n; i++) {
        char key[64];
        snprintf(key, sizeof(key), "model.layers.%zu.w", i);
        int64_t v;
        assert_true(refit_json_int(refit_json_get(root, key), &v));
        assert_int_equal(v, (int64_t)(i * 3));
        assert_string_equal(refit_json_key(root, i, NULL), key);
    }
    assert_null(refit_json_get(root, "model.layers.5000.w"));
    refit_json_free(root);
    /* The same with the last key repeating the first. */
    pos--;
    pos += (size_t)snprintf(text + pos, cap - pos, ",\"model.layers.0.w\":1}");
    REFIT_ASSERT_ERR(refit_json_parse(text, pos, &root), REFIT_ERR_PARSE, "duplicate key \"model.layers.0.w\"");
    free(text);
    /* A long array, and one string of a megabyte. */
    const size_t big = 1 << 20;
    text = malloc(big + 3);
    assert_non_null(text);
    text[0] = '"';
    memset(text + 1, 'x', big);
    text[big + 1] = '"';
    REFIT_ASSERT_OK(refit_json_parse(text, big + 2, &root));
    size_t len;
    assert_non_null(refit_json_string(root, &len));
    assert_int_equal(len, big);
    refit_json_free(root);
    free(text);
    const size_t elems = 200000;
    text = malloc(elems * 2 + 2);
    assert_non_null(text);
    text[0] = '[';
    for (size_t i = 0; i < elems; i++) text[1 + 2 * i] = '1', text[2 + 2 * i] = ',';
    text[elems * 2] = ']';
    REFIT_ASSERT_OK(refit_json_parse(text, elems * 2 + 1, &root));
    assert_int_equal(refit_json_len(root), elems);
    refit_json_free(root);
    free(text);
}

static char *nested(size_t depth, const char *open, const char *inner, const char *close)
{
    size_t lo = strlen(open), lc = strlen(close), li = strlen(inner);
    char *s = malloc(depth * (lo + lc) + li + 1), *p = s;
    assert_non_null(s);
    for (size_t i = 0; i < depth; i++, p += lo) memcpy(p, open, lo);
    memcpy(p, inner, li);
    p += li;
    for (size_t i = 0; i < depth; i++, p += lc) memcpy(p, close, lc);
    *p = '\0';
    return s;
}

static void test_depth(void **state)
{
    (void)state;
    refit_json_t *root;
    char *s = nested(REFIT_JSON_MAX_DEPTH, "[", "1", "]");
    REFIT_ASSERT_OK(refit_json_parse(s, strlen(s), &root));
    const refit_json_t *v = root;
    for (int i = 0; i < REFIT_JSON_MAX_DEPTH; i++) v = refit_json_at(v, 0);
    assert_int_equal(refit_json_type(v), REFIT_JSON_NUMBER);
    refit_json_free(root);
    free(s);
    s = nested(REFIT_JSON_MAX_DEPTH, "{\"k\":", "{}", "}"); /* 65 levels, the innermost empty */
    REFIT_ASSERT_ERR(refit_json_parse(s, strlen(s), &root), REFIT_ERR_PARSE, "nesting deeper than 64");
    free(s);
    s = nested(REFIT_JSON_MAX_DEPTH + 1, "[", "", "]");
    REFIT_ASSERT_ERR(refit_json_parse(s, strlen(s), &root), REFIT_ERR_PARSE, "line 1 column 65: nesting");
    free(s);
    /* Far deeper than any C stack would take, had the parser recursed. */
    s = nested(1000000, "[", "", "]");
    REFIT_ASSERT_ERR(refit_json_parse(s, strlen(s), &root), REFIT_ERR_PARSE, "nesting");
    free(s);
}

static void test_invalid(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        size_t len; /* 0: strlen */
        const char *what;
    } cases[] = {
        {"", 0, "end of input"},
        {"   \n ", 0, "line 2 column 2: unexpected end of input"},
        {"[", 0, "expected a value"},
        {"]", 0, "unexpected ']'"},
        {"{", 0, "string key"},
        {"}", 0, "unexpected '}'"},
        {"[1,]", 0, "line 1 column 4: unexpected ']'"},
        {"[1,,2]", 0, "unexpected ','"},
        {"[1 2]", 0, "expected ',' or ']'"},
        {"{\"a\":1,}", 0, "string key"},
        {"{\"a\" 1}", 0, "expected ':'"},
        {"{\"a\":1 \"b\":2}", 0, "expected ',' or '}'"},
        {"{a:1}", 0, "string key"},
        {"{'a':1}", 0, "string key"},
        {"{1:2}", 0, "string key"},
        {"[1}", 0, "expected ',' or ']'"},
        {"{\"a\":1]", 0, "expected ',' or '}'"},
        {"01", 0, "leading zero"},
        {"-01", 0, "leading zero"},
        {"-", 0, "'-' without digits"},
        {"-a", 0, "'-' without digits"},
        {"1.", 0, "after the decimal point"},
        {"1.e3", 0, "after the decimal point"},
        {".5", 0, "unexpected '.'"},
        {"1e", 0, "exponent"},
        {"1e+", 0, "exponent"},
        {"+1", 0, "unexpected '+'"},
        {"0x10", 0, "unexpected 'x'"},
        {"1e999", 0, "out of range"},
        {"-1e400", 0, "out of range"},
        {"NaN", 0, "unexpected 'N'"},
        {"Infinity", 0, "unexpected 'I'"},
        {"-Infinity", 0, "'-' without digits"},
        {"tru", 0, "unexpected 't'"},
        {"nul", 0, "unexpected 'n'"},
        {"True", 0, "unexpected 'T'"},
        {"truex", 0, "end of input after the value"},
        {"1 2", 0, "line 1 column 3"},
        {"{}{}", 0, "end of input after the value"},
        {"[1]x", 0, "end of input after the value"},
        {"\"abc", 0, "unterminated string"},
        {"\"abc\\\"", 0, "unterminated string"},
        {"\"\\x\"", 0, "invalid escape '\\x'"},
        {"\"\\'\"", 0, "invalid escape"},
        {"\"\\U0041\"", 0, "invalid escape"},
        {"\"\\u12\"", 0, "four hex digits"},
        {"\"\\uZZZZ\"", 0, "four hex digits"},
        {"\"\\u12G4\"", 0, "four hex digits"},
        {"\"\\uD800\"", 0, "not followed by a low surrogate"},
        {"\"\\uD800\\u0041\"", 0, "not followed by a low surrogate"},
        {"\"\\uD800\\uD800\"", 0, "not followed by a low surrogate"},
        {"\"\\uDC00\"", 0, "unpaired low surrogate"},
        {"\"a\tb\"", 0, "control character U+0009"},
        {"\"a\nb\"", 0, "control character U+000A"},
        {"\"\x01\"", 0, "control character U+0001"},
        {"\"a\0b\"", 5, "control character U+0000"},
        {"\"\xFF\"", 0, "invalid UTF-8"},
        {"\"\xC0\xAF\"", 0, "invalid UTF-8"},         /* overlong '/' */
        {"\"\xE0\x80\xAF\"", 0, "invalid UTF-8"},     /* overlong */
        {"\"\xED\xA0\x80\"", 0, "invalid UTF-8"},     /* a surrogate in UTF-8 */
        {"\"\xF4\x90\x80\x80\"", 0, "invalid UTF-8"}, /* above U+10FFFF */
        {"\"\xC3\"", 0, "invalid UTF-8"},             /* truncated */
        {"\"\x80\"", 0, "invalid UTF-8"},             /* lone continuation */
        {"[\xC3\xA9]", 0, "unexpected byte 0xc3"},
        {"1\0", 2, "unexpected byte 0x00"},
        {"/* comment */ 1", 0, "unexpected '/'"},
        {"[1] // comment", 0, "end of input after the value"},
        {"{\"a\":1,\"a\":2}", 0, "line 1 column 8: duplicate key \"a\""},
        {"{\"a\\u0000\":1,\"a\\u0000\":2}", 0, "duplicate key \"a?\""},
        {"\xEF\xBB\xBF", 0, "end of input"},
        {"\xEF\xBB", 0, "unexpected byte 0xef"},
        {"\f1", 0, "unexpected byte 0x0c"},
        {"{\n  \"a\": 1,\n  \"b\": tru\n}", 0, "line 3 column 8: unexpected 't'"},
        {"{\"\xC3\xA9\xE2\x82\xAC\": x}", 0, "line 1 column 8: unexpected 'x'"}, /* columns count characters */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        refit_json_t *root = (refit_json_t *)&root; /* not written on failure */
        size_t len = cases[i].len ? cases[i].len : strlen(cases[i].text);
        refit_status_t st = refit_json_parse(cases[i].text, len, &root);
        if (st != REFIT_ERR_PARSE)
            fail_msg("case %zu (%s): %s, want REFIT_ERR_PARSE", i, cases[i].text, refit_status_name(st));
        const char *detail = refit_last_error();
        if (strncmp(detail, "line ", 5) != 0 || !strstr(detail, " column ") || !strstr(detail, cases[i].what))
            fail_msg("case %zu (%s): detail \"%s\" lacks \"%s\"", i, cases[i].text, detail, cases[i].what);
        assert_ptr_equal(root, (refit_json_t *)&root);
    }
    refit_json_t *root;
    assert_int_equal(refit_json_parse(NULL, 1, &root), REFIT_ERR_INVALID_ARG);
    assert_int_equal(refit_json_parse("1", 1, NULL), REFIT_ERR_INVALID_ARG);
    REFIT_ASSERT_ERR(refit_json_parse(NULL, 0, &root), REFIT_ERR_PARSE, "line 1 column 1");
    /* The length bounds the text: what follows is never read. */
    REFIT_ASSERT_OK(refit_json_parse("[1]garbage", 3, &root));
    refit_json_free(root);
    REFIT_ASSERT_ERR(refit_json_parse("\"abc\"", 4, &root), REFIT_ERR_PARSE, "unterminated");
    REFIT_ASSERT_ERR(refit_json_parse("truex", 3, &root), REFIT_ERR_PARSE, "unexpected 't'");
    REFIT_ASSERT_OK(refit_json_parse("1234", 2, &root));
    int64_t i;
    assert_true(refit_json_int(root, &i));
    assert_int_equal(i, 12);
    refit_json_free(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_containers),
        cmocka_unit_test(test_safetensors_header),
        cmocka_unit_test(test_large_object),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
