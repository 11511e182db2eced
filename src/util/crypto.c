/* SHA-256, HMAC, HKDF, constant-time compare, kernel randomness, memory for secrets (see crypto.h).
 * Straight from FIPS 180-4 section 6.2 and RFCs 2104 / 5869. */
#include "util/crypto.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static inline uint32_t ror(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }

/* One round with the working variables renamed instead of shifted (eight
 * rounds bring them back to their places): the shifting loop left every
 * round a chain of register moves; it ran at 57-67 MB/s here, this form at
 * 90-115 MB/s (`openssl speed sha256`: 170 MB/s on the same CPU).  Ch as
 * g ^ (e & (f ^ g)), Maj as (a & b) | (c & (a | b)): equal to FIPS 180-4's. */
#define SHA256_ROUND(a, b, c, d, e, f, g, h, i)                                                          \
    do {                                                                                                 \
        uint32_t t1_ = h + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + (g ^ (e & (f ^ g))) + K256[i] + w[i]; \
        d += t1_;                                                                                        \
        h = t1_ + (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) | (c & (a | b)));                     \
    } while (0)

static void compress(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i += 8) {
        SHA256_ROUND(a, b, c, d, e, f, g, k, i);
        SHA256_ROUND(k, a, b, c, d, e, f, g, i + 1);
        SHA256_ROUND(g, k, a, b, c, d, e, f, i + 2);
        SHA256_ROUND(f, g, k, a, b, c, d, e, i + 3);
        SHA256_ROUND(e, f, g, k, a, b, c, d, i + 4);
        SHA256_ROUND(d, e, f, g, k, a, b, c, i + 5);
        SHA256_ROUND(c, d, e, f, g, k, a, b, i + 6);
        SHA256_ROUND(b, c, d, e, f, g, k, a, i + 7);
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void refit_sha256_init(refit_sha256_t *s)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof(iv));
    s->total = 0;
    s->used = 0;
}

void refit_sha256_update(refit_sha256_t *s, const void *data, size_t len)
{
    const uint8_t *p = data;
    s->total += len;
    if (s->used) {
        size_t n = REFIT_MIN(len, 64 - s->used);
        memcpy(s->buf + s->used, p, n);
        s->used += n;
        p += n;
        len -= n;
        if (s->used < 64) return;
        compress(s->h, s->buf);
        s->used = 0;
    }
    for (; len >= 64; p += 64, len -= 64) compress(s->h, p);
    memcpy(s->buf, p, len);
    s->used = len;
}

void refit_sha256_final(refit_sha256_t *s, uint8_t out[REFIT_SHA256_LEN])
{
    uint64_t bits = s->total * 8;
    uint8_t pad[72] = {0x80};
    size_t n = (s->used < 56 ? 56 : 120) - s->used;
    for (int i = 0; i < 8; i++) pad[n + i] = (uint8_t)(bits >> (56 - 8 * i));
    refit_sha256_update(s, pad, n + 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
    refit_wipe(s, sizeof(*s));
}

void refit_sha256(const void *data, size_t len, uint8_t out[REFIT_SHA256_LEN])
{
    refit_sha256_t s;
    refit_sha256_init(&s);
    refit_sha256_update(&s, data, len);
    refit_sha256_final(&s, out);
}

void refit_hmac_init(refit_hmac_t *h, const void *key, size_t key_len)
{
    uint8_t k[64] = {0}, pad[64];
    if (key_len > 64) refit_sha256(key, key_len, k);
    else if (key_len) memcpy(k, key, key_len);
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    refit_sha256_init(&h->inner);
    refit_sha256_update(&h->inner, pad, 64);
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    refit_sha256_init(&h->outer);
    refit_sha256_update(&h->outer, pad, 64);
    refit_wipe(k, sizeof(k));
    refit_wipe(pad, sizeof(pad));
}

void refit_hmac_update(refit_hmac_t *h, const void *data, size_t len) { refit_sha256_update(&h->inner, data, len); }

void refit_hmac_final(refit_hmac_t *h, uint8_t out[REFIT_SHA256_LEN])
{
    uint8_t in[REFIT_SHA256_LEN];
    refit_sha256_final(&h->inner, in);
    refit_sha256_update(&h->outer, in, sizeof(in));
    refit_sha256_final(&h->outer, out);
    refit_wipe(in, sizeof(in));
}

void refit_hmac(const void *key, size_t key_len, const void *data, size_t len, uint8_t out[REFIT_SHA256_LEN])
{
    refit_hmac_t h;
    refit_hmac_init(&h, key, key_len);
    refit_hmac_update(&h, data, len);
    refit_hmac_final(&h, out);
}

void refit_hkdf(const void *salt, size_t salt_len, const void *ikm, size_t ikm_len, const void *info, size_t info_len,
                uint8_t *out, size_t out_len)
{
    uint8_t prk[REFIT_SHA256_LEN], t[REFIT_SHA256_LEN];
    static const uint8_t zero[REFIT_SHA256_LEN];
    refit_hmac(salt_len ? salt : zero, salt_len ? salt_len : sizeof(zero), ikm, ikm_len, prk);
    size_t done = 0;
    for (uint8_t i = 1; done < out_len && i != 0; i++) {
        refit_hmac_t h;
        refit_hmac_init(&h, prk, sizeof(prk));
        if (i > 1) refit_hmac_update(&h, t, sizeof(t));
        refit_hmac_update(&h, info, info_len);
        refit_hmac_update(&h, &i, 1);
        refit_hmac_final(&h, t);
        size_t n = REFIT_MIN(out_len - done, sizeof(t));
        memcpy(out + done, t, n);
        done += n;
    }
    refit_wipe(prk, sizeof(prk));
    refit_wipe(t, sizeof(t));
}

bool refit_ct_equal(const void *a, const void *b, size_t n)
{
    const volatile uint8_t *x = a, *y = b;
    uint8_t d = 0;
    for (size_t i = 0; i < n; i++) d |= (uint8_t)(x[i] ^ y[i]);
    return d == 0;
}

refit_status_t refit_random_bytes(void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            return refit_error(REFIT_ERR_INTERNAL, "getrandom: %s", strerror(errno));
        }
        p += r;
        n -= (size_t)r;
    }
    return REFIT_OK;
}

void refit_wipe(void *p, size_t n)
{
    volatile uint8_t *v = p;
    while (n--) *v++ = 0;
}

static size_t secret_bytes(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (REFIT_MAX(n, 1) + pg - 1) / pg * pg;
}

/* Pages of their own, so that MADV_DONTDUMP covers the secret and nothing
 * else.  Not PR_SET_DUMPABLE = 0: it would also forbid same-user receivers
 * to process_vm_readv a publisher's attached memory (transport/shm.c).  Not
 * MADV_WIPEONFORK or DONTFORK: forked children (tests, tools) open
 * registries with the process's copy of the secret. */
void *refit_secret_alloc(size_t n)
{
    size_t len = secret_bytes(n);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    /* Linux >= 3.4; where it fails the pages are merely dumped, as malloc's are. */
    (void)madvise(p, len, MADV_DONTDUMP);
    return p;
}

void refit_secret_free(void *p, size_t n)
{
    if (!p) return;
    size_t len = secret_bytes(n);
    refit_wipe(p, len);
    munmap(p, len);
}
