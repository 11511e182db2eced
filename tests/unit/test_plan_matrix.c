/* Executed, byte-verified plans over the layout matrix of the core issue:
 * megatron tp{1,2,4} x pp{1,2} x ep{1,2,4,8} -> vllm tp{1,2,4,8} x ep{1,2,4,8},
 * hf <-> megatron <-> vllm both ways, tp > kv heads, padded vocab, tied
 * embeddings, DP replicas, MLA. */
#include "testutil.h"

#include <stdio.h>

static void megatron_to_vllm_matrix(void **state)
{
    (void)state;
    const unsigned tps[] = {1, 2, 4}, pps[] = {1, 2}, eps[] = {1, 2, 4, 8};
    const unsigned vtps[] = {1, 2, 4, 8}, veps[] = {1, 2, 4, 8};
    unsigned pairs = 0, ranks = 0;
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 2; b++)
            for (size_t c = 0; c < 4; c++) {
                char src[96];
                snprintf(src, sizeof(src), "megatron:tp=%u,pp=%u,ep=%u", tps[a], pps[b], eps[c]);
                for (size_t d = 0; d < 4; d++)
                    for (size_t e = 0; e < 4; e++) {
                        unsigned tp = vtps[d], ep = veps[e];
                        if (ep != 1 && ep % tp != 0) continue; /* vllm ep is 1 or tp*dp */
                        char dst[96];
                        snprintf(dst, sizeof(dst), "vllm:tp=%u,ep=%u", tp, ep);
                        ranks += t_execute_pair("tiny-moe", src, dst, 3);
                        pairs++;
                    }
            }
    printf("megatron->vllm: %u layout pairs, %u destination ranks verified\n", pairs, ranks);
    assert_int_equal(pairs, 24 * 13);
}

static void expert_tensor_parallel(void **state)
{
    (void)state;
    /* etp different from tp, in both directions of the split. */
    t_execute_pair("tiny-moe", "megatron:tp=2,ep=2,etp=1", "vllm:tp=4", 5);
    t_execute_pair("tiny-moe", "megatron:tp=1,ep=2,etp=2,dp=4", "vllm:tp=2,ep=2", 5);
    t_execute_pair("tiny-moe", "megatron:tp=4,ep=4,etp=1", "vllm:tp=1", 5);
    t_execute_pair("tiny-moe", "megatron:tp=2,pp=2,ep=8,etp=2", "vllm:tp=2,dp=4,ep=8", 5);
}

static void reverse_vllm_to_megatron(void **state)
{
    (void)state;
    const char *srcs[] = {"vllm:tp=1", "vllm:tp=2", "vllm:tp=8", "vllm:tp=2,ep=2", "vllm:tp=4,dp=2,ep=8"};
    const char *dsts[] = {"megatron:tp=1,pp=2", "megatron:tp=4,ep=2", "megatron:ep=8", "megatron:tp=2,pp=2,ep=4,etp=1"};
    for (size_t i = 0; i < 5; i++)
        for (size_t j = 0; j < 4; j++) t_execute_pair("tiny-moe", srcs[i], dsts[j], 11);
}

static void hf_roundtrips(void **state)
{
    (void)state;
    const char *models[] = {"tiny-dense", "tiny-moe", "tiny-tied", "tiny-mla"};
    const char *layouts[] = {"megatron:tp=2,pp=2,first=1", "vllm:tp=2", "megatron:tp=1", "vllm:tp=4"};
    for (size_t m = 0; m < 4; m++)
        for (size_t l = 0; l < 4; l++) {
            t_execute_pair(models[m], "hf", layouts[l], 2);
            t_execute_pair(models[m], layouts[l], "hf", 2);
        }
}

static void kv_heads_fewer_than_tp(void **state)
{
    (void)state;
    /* tiny-dense has 2 kv heads, tiny-tied 1: tp 4 and 8 replicate kv heads in vllm and cut groups in megatron. */
    t_execute_pair("tiny-dense", "megatron:tp=4", "vllm:tp=8", 4);
    t_execute_pair("tiny-dense", "vllm:tp=8", "megatron:tp=4,pp=2", 4);
    t_execute_pair("tiny-dense", "megatron:tp=8", "megatron:tp=2", 4);
    t_execute_pair("tiny-tied", "megatron:tp=4", "vllm:tp=4", 4);
    t_execute_pair("tiny-tied", "vllm:tp=4", "megatron:tp=2,pp=2", 4);
}

static void dense_and_mla_matrix(void **state)
{
    (void)state;
    const char *srcs[] = {"megatron:tp=1", "megatron:tp=2,pp=2", "megatron:tp=4,dp=2", "megatron:tp=8,pp=1"};
    const char *dsts[] = {"vllm:tp=1", "vllm:tp=2", "vllm:tp=4", "vllm:tp=8"};
    for (size_t i = 0; i < 4; i++)
        for (size_t j = 0; j < 4; j++) t_execute_pair("tiny-dense", srcs[i], dsts[j], 6);
    const char *msrcs[] = {"megatron:tp=1,ep=8", "megatron:tp=2,pp=3,ep=4", "megatron:tp=4,ep=2,etp=2"};
    const char *mdsts[] = {"vllm:tp=1", "vllm:tp=2,ep=2", "vllm:tp=8", "vllm:tp=4,dp=2,ep=8"};
    for (size_t i = 0; i < 3; i++)
        for (size_t j = 0; j < 4; j++) t_execute_pair("tiny-mla", msrcs[i], mdsts[j], 6);
}

static void vocab_padding_options(void **state)
{
    (void)state;
    /* Megatron-Bridge style (no padding) needs vocab divisible by tp; 997 is prime, so use tp=1. */
    t_execute_pair("tiny-moe", "megatron:tp=1,pad=0", "vllm:tp=4,pad=64", 8);
    t_execute_pair("tiny-moe", "vllm:tp=1,pad=0", "megatron:tp=2,pad=128", 8);
    t_execute_pair("tiny-moe", "megatron:tp=4,pad=256", "vllm:tp=8", 8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(megatron_to_vllm_matrix),  cmocka_unit_test(expert_tensor_parallel),
        cmocka_unit_test(reverse_vllm_to_megatron), cmocka_unit_test(hf_roundtrips),
        cmocka_unit_test(kv_heads_fewer_than_tp),   cmocka_unit_test(dense_and_mla_matrix),
        cmocka_unit_test(vocab_padding_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
