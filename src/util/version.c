/* refit_version() and refit_features(): what this build of the library is.
 * The feature bits follow the REFIT_HAVE_* definitions CMakeLists.txt gives
 * the library's sources for each optional dependency it built with. */
#include <stddef.h>

#include "refit/version.h"

#define REFIT_STR_(x) #x
#define REFIT_STR(x) REFIT_STR_(x)

const char *refit_version(int *major, int *minor, int *patch)
{
    if (major) *major = REFIT_VERSION_MAJOR;
    if (minor) *minor = REFIT_VERSION_MINOR;
    if (patch) *patch = REFIT_VERSION_PATCH;
    return REFIT_STR(REFIT_VERSION_MAJOR) "." REFIT_STR(REFIT_VERSION_MINOR) "." REFIT_STR(REFIT_VERSION_PATCH);
}

unsigned refit_features(void)
{
    unsigned f = REFIT_FEATURE_SHM;
#ifdef REFIT_HAVE_UCX
    f |= REFIT_FEATURE_UCX;
#endif
#ifdef REFIT_HAVE_CUDA
    f |= REFIT_FEATURE_CUDA;
#endif
#ifdef REFIT_HAVE_REDIS
    f |= REFIT_FEATURE_REDIS;
#endif
    return f;
}

const char *refit_feature_name(unsigned feature)
{
    switch (feature) {
#define REFIT_FEATURE_CASE_(name, bit, short_name, text) \
    case REFIT_FEATURE_##name: return short_name;
        REFIT_FEATURE_MAP(REFIT_FEATURE_CASE_)
#undef REFIT_FEATURE_CASE_
    default: return NULL;
    }
}
