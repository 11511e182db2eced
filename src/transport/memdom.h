/* Memory domains: where a publisher's or a receiver's regions live (host
 * memory, or one GPU's) and the few operations the engine needs on that
 * memory beyond what transports do: allocate it, copy it to and from host
 * memory, stage it in host memory, write a plan's padding into it, check the
 * synthetic truth in it.
 *
 * The engine holds one domain per publisher or receiver and never includes
 * a device header: the host domain is src/engine/memdom.c, the CUDA domain
 * src/transport/cuda/memdom.cu (the only folder that includes CUDA headers),
 * found through refit_memdom_device().  Every operation is synchronous and
 * may be called from any thread. */
#ifndef REFIT_TRANSPORT_MEMDOM_H
#define REFIT_TRANSPORT_MEMDOM_H

#include <stdint.h>

#include "refit/experimental/fp8.h"
#include "refit/manifest.h"
#include "refit/plan.h"
#include "refit/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct refit_memdom {
    const char *name; /* "host", "cuda" */
    /* `size` bytes of this domain's memory on device dev (ignored by the
     * host), zeroed; free() takes NULL. */
    refit_status_t (*alloc)(int dev, uint64_t size, void **out);
    void (*free)(void *p);
    /* Copies n bytes between any two of this domain's memory and host memory. */
    refit_status_t (*copy)(void *dst, const void *src, uint64_t n);
    /* Host memory (zeroed) that this domain's memory is copied to and from
     * fastest (pinned for a GPU); staging_free() takes NULL. */
    refit_status_t (*staging_alloc)(uint64_t size, void **out);
    void (*staging_free)(void *p);
    /* Writes the plan's padding (zeros) into bases, this domain's memory on
     * dev; adds the kernel launches it took to *launches. */
    refit_status_t (*fills)(const refit_plan_t *plan, int dev, void *const *bases, uint64_t *launches);
    /* Checks the synthetic truth of `version` in bases (a sample of
     * `fraction` of the bytes where the domain can sample; else all). */
    refit_status_t (*truth_verify)(const refit_manifest_t *m, int dev, const void *const *bases, uint64_t version,
                                   double fraction);
    /* The same for an FP8 receiver's arena (refit/fp8.h): the target of the
     * bf16 manifest m, quantized from the truth; NULL where FP8 receivers
     * cannot be (they quantize on a GPU). */
    refit_status_t (*fp8_truth_verify)(const refit_manifest_t *m, const refit_fp8_target_t *t, int dev,
                                       const void *arena, uint64_t version);
} refit_memdom_t;

#ifdef REFIT_HAVE_CUDA
extern const refit_memdom_t refit_memdom_cuda;
#endif

/* The device memory domain built into this library, or NULL (transport.c). */
const refit_memdom_t *refit_memdom_device(void);

#ifdef __cplusplus
}
#endif
#endif
