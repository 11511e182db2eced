/* Replays a fuzz corpus through LLVMFuzzerTestOneInput without libFuzzer, so
 * ctest runs every committed input under every build (sanitizers included).
 * Usage: fuzz_X_replay DIR_OR_FILE... ; exits non-zero if nothing was found. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return perror(path), -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int files = 0;
    for (int a = 1; a < argc; a++) {
        struct stat st;
        if (stat(argv[a], &st) != 0) return perror(argv[a]), 2;
        if (S_ISDIR(st.st_mode)) {
            DIR *d = opendir(argv[a]);
            struct dirent *e;
            while (d && (e = readdir(d))) {
                if (e->d_name[0] == '.') continue;
                char path[4096];
                snprintf(path, sizeof(path), "%s/%s", argv[a], e->d_name);
                if (run_file(path) == 0) files++;
            }
            if (d) closedir(d);
        } else if (run_file(argv[a]) == 0) {
            files++;
        }
    }
    printf("replayed %d inputs\n", files);
    return files > 0 ? 0 : 1;
}
