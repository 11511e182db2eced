/* The synthetic truth (truth.c) as REFIT_HD functions: the same bits on the
 * host and on a GPU.  tests/unit/test_cuda_truth.c checks these against
 * refit_truth_value / refit_hash64 on the CPU. */
#ifndef REFIT_TRUTH_HD_H
#define REFIT_TRUTH_HD_H

#include <stddef.h>
#include <stdint.h>

#include "refit/types.h"
#include "util/hd.h"

REFIT_HD static inline uint64_t refit_hd_mix64(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ULL;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dULL;
    x ^= x >> 33;
    return x;
}

/* refit_hash64 (util.c), byte for byte. */
REFIT_HD static inline uint64_t refit_hd_hash64(const unsigned char *p, size_t len, uint64_t seed)
{
    uint64_t h = refit_hd_mix64(seed ^ (len * 0x9e3779b97f4a7c15ULL));
    while (len >= 8) {
        uint64_t w = 0;
        for (int i = 0; i < 8; i++) w |= (uint64_t)p[i] << (8 * i);
        h = (h ^ refit_hd_mix64(w)) * 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 29;
        p += 8;
        len -= 8;
    }
    uint64_t tail = 0;
    for (size_t i = 0; i < len; i++) tail |= (uint64_t)p[i] << (8 * i);
    h = (h ^ refit_hd_mix64(tail ^ 0xa0761d6478bd642fULL)) * 0x94d049bb133111ebULL;
    return refit_hd_mix64(h);
}

/* refit_truth_tensor_seed. */
REFIT_HD static inline uint64_t refit_hd_tensor_seed(const char *name)
{
    size_t n = 0;
    while (name[n]) n++;
    return refit_hd_hash64((const unsigned char *)name, n, 0x7472757468ULL);
}

/* refit_truth_value. */
REFIT_HD static inline uint64_t refit_hd_truth_value(uint64_t seed, uint32_t dtype, uint64_t index, uint64_t version)
{
    uint64_t h = refit_hd_mix64(seed ^
                                refit_hd_mix64(index * 0x9e3779b97f4a7c15ULL + version * 0xc2b2ae3d27d4eb4fULL + 1));
    uint64_t sign = h >> 63, par = (index & 1) | ((version & 1) << 1);
    switch (dtype) {
    case REFIT_DTYPE_BF16: return sign << 15 | (118 + ((h >> 8) & 15)) << 7 | ((h >> 20) & 0x7c) | par;
    case REFIT_DTYPE_F16: return sign << 15 | (8 + ((h >> 8) & 15)) << 10 | ((h >> 20) & 0x3fc) | par;
    case REFIT_DTYPE_F32: return sign << 31 | (118 + ((h >> 8) & 15)) << 23 | ((h >> 24) & 0x7ffffc) | par;
    case REFIT_DTYPE_F8_E4M3: return sign << 7 | (3 + ((h >> 8) & 7)) << 3 | ((h >> 20) & 4) | par;
    case REFIT_DTYPE_I32: return ((h >> 2) << 2 | par) & 0xffffffffULL;
    case REFIT_DTYPE_I64: return (h >> 2) << 2 | par;
    case REFIT_DTYPE_U8: return ((h >> 2) << 2 | par) & 0xff;
    default: return 0;
    }
}

/* Positional digest of 8-byte words: the wrapping sum over words i of
 * refit_hd_digest_word(word_i, i).  Order of summation does not matter, so
 * a GPU computes it with atomics; any changed, moved or swapped word changes
 * it (with overwhelming probability).  A trailing partial word is
 * zero-padded. */
REFIT_HD static inline uint64_t refit_hd_digest_word(uint64_t w, uint64_t i)
{
    return refit_hd_mix64(w ^ refit_hd_mix64(i * 0x9e3779b97f4a7c15ULL + 0x646967657374ULL));
}

#endif
