/* SHA-256, HMAC-SHA-256 and HKDF against the published test vectors (FIPS
 * 180-4 examples, RFC 4231, RFC 5869), streaming in odd pieces, the
 * constant-time compare and the kernel's random bytes. */
#include "testutil.h"

#include <stdio.h>
#include <string.h>

#include "util/crypto.h"

static void hex(const uint8_t *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", p[i]);
}

static void check_sha(const void *data, size_t len, const char *want)
{
    uint8_t d[32];
    char h[65];
    refit_sha256(data, len, d);
    hex(d, 32, h);
    assert_string_equal(h, want);
    /* The same in pieces of every size 1..67. */
    for (size_t piece = 1; piece < 68 && len; piece += 3) {
        refit_sha256_t s;
        refit_sha256_init(&s);
        for (size_t o = 0; o < len; o += piece)
            refit_sha256_update(&s, (const char *)data + o, REFIT_MIN(piece, len - o));
        refit_sha256_final(&s, d);
        hex(d, 32, h);
        assert_string_equal(h, want);
    }
}

static void test_sha256(void **state)
{
    (void)state;
    check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check_sha(two, strlen(two), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    char *million = malloc(1000000);
    assert_non_null(million);
    memset(million, 'a', 1000000);
    check_sha(million, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(million);
}

static void check_hmac(const void *key, size_t klen, const void *data, size_t len, const char *want)
{
    uint8_t d[32];
    char h[65];
    refit_hmac(key, klen, data, len, d);
    hex(d, 32, h);
    assert_string_equal(h, want);
}

static void test_hmac(void **state)
{
    (void)state;
    uint8_t k1[20];
    memset(k1, 0x0b, sizeof(k1));
    check_hmac(k1, sizeof(k1), "Hi There", 8, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    check_hmac("Jefe", 4, "what do ya want for nothing?", 28,
               "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    uint8_t k6[131];
    memset(k6, 0xaa, sizeof(k6));
    const char *d6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    check_hmac(k6, sizeof(k6), d6, strlen(d6), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    /* A different key or message changes the tag. */
    uint8_t a[32], b[32];
    refit_hmac("Jefe", 4, "x", 1, a);
    refit_hmac("Jeff", 4, "x", 1, b);
    assert_false(refit_ct_equal(a, b, 32));
}

static void test_hkdf(void **state)
{
    (void)state;
    uint8_t ikm[22], salt[13], info[10], okm[42];
    char h[85];
    memset(ikm, 0x0b, sizeof(ikm));
    for (int i = 0; i < 13; i++) salt[i] = (uint8_t)i;
    for (int i = 0; i < 10; i++) info[i] = (uint8_t)(0xf0 + i);
    refit_hkdf(salt, sizeof(salt), ikm, sizeof(ikm), info, sizeof(info), okm, sizeof(okm));
    hex(okm, sizeof(okm), h);
    assert_string_equal(h, "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
}

static void test_compare_and_random(void **state)
{
    (void)state;
    uint8_t a[64], b[64];
    REFIT_ASSERT_OK(refit_random_bytes(a, sizeof(a)));
    memcpy(b, a, sizeof(a));
    assert_true(refit_ct_equal(a, b, sizeof(a)));
    for (size_t i = 0; i < sizeof(a); i++) {
        b[i] ^= 0x80;
        assert_false(refit_ct_equal(a, b, sizeof(a)));
        b[i] ^= 0x80;
    }
    REFIT_ASSERT_OK(refit_random_bytes(b, sizeof(b)));
    assert_false(refit_ct_equal(a, b, sizeof(a))); /* 2^-512 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256),
        cmocka_unit_test(test_hmac),
        cmocka_unit_test(test_hkdf),
        cmocka_unit_test(test_compare_and_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
