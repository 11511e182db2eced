/* Private directories found without being told (userdir.h).  Pure functions
 * of the environment, the passwd database and a key: built into the library
 * and a second time into refit_tool_pure, so `refit preflight` reports the
 * directory a publisher would use from the same code. */
#include "util/userdir.h"

#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/crypto.h"
#include "util/env.h"

static bool absolute(const char *p) { return p && p[0] == '/'; }

bool refit_runtime_dir(const char *option, char *out, size_t n, const char **source)
{
    const char *env = refit_env(REFIT_ENV_RUNTIME_DIR), *run = refit_env(REFIT_ENV_XDG_RUNTIME_DIR), *src = NULL;
    if (option && option[0]) src = "shm.dir", snprintf(out, n, "%s", option);
    else if (env && env[0]) src = "REFIT_RUNTIME_DIR", snprintf(out, n, "%s", env);
    else if (absolute(run)) src = "XDG_RUNTIME_DIR", snprintf(out, n, "%s/refit", run);
    if (source) *source = src;
    return src != NULL;
}

void refit_job_runtime_dir(const uint8_t key[32], char *out, size_t n)
{
    static const char label[] = "refit shm runtime directory";
    uint8_t mac[REFIT_SHA256_LEN];
    refit_hmac(key, 32, label, sizeof(label) - 1, mac);
    snprintf(out, n, "/tmp/refit-%u-%02x%02x%02x%02x%02x%02x%02x%02x", (unsigned)geteuid(), mac[0], mac[1], mac[2],
             mac[3], mac[4], mac[5], mac[6], mac[7]);
}

bool refit_default_registry_dir(char *out, size_t n)
{
    const char *run = refit_env(REFIT_ENV_XDG_RUNTIME_DIR), *home = refit_env(REFIT_ENV_HOME);
    if (absolute(run)) {
        snprintf(out, n, "%s/refit/registry", run);
        return true;
    }
    if (absolute(home) && strcmp(home, "/") != 0) {
        snprintf(out, n, "%s/.cache/refit/registry", home);
        return true;
    }
    /* HOME unset (env -i, some services and containers): the home the
     * system records for this user, which is what HOME would have said. */
    char buf[4096];
    struct passwd pw, *res = NULL;
    if (getpwuid_r(geteuid(), &pw, buf, sizeof(buf), &res) == 0 && res && absolute(res->pw_dir) &&
        strcmp(res->pw_dir, "/") != 0) {
        snprintf(out, n, "%s/.cache/refit/registry", res->pw_dir);
        return true;
    }
    return false;
}
