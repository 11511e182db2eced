/* Cryptographic primitives for the authenticated control plane: SHA-256
 * (FIPS 180-4), HMAC-SHA-256 (RFC 2104), HKDF-SHA-256 (RFC 5869), a
 * constant-time comparison and the kernel's random bytes.  Written from the
 * standards; test vectors in tests/unit/test_crypto.c.  No secret-dependent
 * branches or table lookups (SHA-256 has none by construction). */
#ifndef REFIT_CRYPTO_H
#define REFIT_CRYPTO_H

#include "util/util.h"

#define REFIT_SHA256_LEN 32

typedef struct {
    uint32_t h[8];
    uint64_t total; /* bytes hashed so far */
    uint8_t buf[64];
    size_t used; /* bytes in buf */
} refit_sha256_t;

void refit_sha256_init(refit_sha256_t *s);
void refit_sha256_update(refit_sha256_t *s, const void *data, size_t len);
void refit_sha256_final(refit_sha256_t *s, uint8_t out[REFIT_SHA256_LEN]);
void refit_sha256(const void *data, size_t len, uint8_t out[REFIT_SHA256_LEN]);

/* HMAC-SHA-256 in pieces: init with the key, update with each part, final. */
typedef struct {
    refit_sha256_t inner, outer;
} refit_hmac_t;
void refit_hmac_init(refit_hmac_t *h, const void *key, size_t key_len);
void refit_hmac_update(refit_hmac_t *h, const void *data, size_t len);
void refit_hmac_final(refit_hmac_t *h, uint8_t out[REFIT_SHA256_LEN]);
void refit_hmac(const void *key, size_t key_len, const void *data, size_t len, uint8_t out[REFIT_SHA256_LEN]);

/* HKDF-SHA-256: extract (salt, ikm) then expand (info) into out_len <= 255*32 bytes. */
void refit_hkdf(const void *salt, size_t salt_len, const void *ikm, size_t ikm_len, const void *info, size_t info_len,
                uint8_t *out, size_t out_len);

/* 1 when the n bytes are equal; time independent of where they differ. */
bool refit_ct_equal(const void *a, const void *b, size_t n);

/* Fills buf from the kernel (getrandom); REFIT_ERR_INTERNAL if it cannot. */
refit_status_t refit_random_bytes(void *buf, size_t n);

/* Overwrites n bytes with zeros in a way the compiler keeps. */
void refit_wipe(void *p, size_t n);

/* Memory for secrets and keys derived from them: n bytes (zeroed) on pages of
 * their own, page-aligned, left out of core dumps (MADV_DONTDUMP).  NULL when
 * out of memory.  refit_secret_free(p, n) (n as allocated) zeroes and unmaps
 * them; NULL is accepted. */
void *refit_secret_alloc(size_t n);
void refit_secret_free(void *p, size_t n);

#endif
