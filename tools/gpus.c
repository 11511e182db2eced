/* refit gpus: the CUDA devices here as JSON (count 0 without any). */
#include <stdio.h>

#include "tool.h"

int cmd_gpus(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    if (refit_features() & REFIT_FEATURE_CUDA) {
        int n = refit_gpu_count();
        printf("{\"cuda\":true,\"count\":%d,\"devices\":[", n);
        for (int d = 0; d < n; d++) {
            if (d) printf(",");
            tool_print_gpu(stdout, d);
        }
        printf("],\"peer_access\":[");
        for (int a = 0; a < n; a++)
            for (int b = 0; b < n; b++)
                if (a != b)
                    printf("%s[%d,%d,%s]", a + b > 1 || a ? "," : "", a, b,
                           refit_gpu_can_access_peer(a, b) ? "true" : "false");
        printf("],\"ucx\":");
    } else {
        printf("{\"cuda\":false,\"count\":0,\"devices\":[],\"ucx\":");
    }
    tool_json_string(stdout, tool_ucx_cuda_status());
    printf("}\n");
    return 0;
}
