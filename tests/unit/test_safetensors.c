/* Checkpoint files that are not regular files: a FIFO, a device, a directory
 * named like a shard or an index is refused with the path and what it is,
 * never opened for reading (docs/security.md: a FIFO named model.safetensors blocked
 * `refit publish --from-safetensors` forever).  Every test arms an alarm, so
 * a reader that blocks fails the test instead of hanging it. */
#include "testutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "refit/experimental/safetensors.h"

#define ALARM_S 30

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof(g_dir), "%s/refit-st-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return t_rm_tree(g_dir);
}

/* g_dir/sub (made once) and g_dir/sub/name, into path[512]. */
static const char *path_in(const char *sub, const char *name, char *path)
{
    snprintf(path, 512, "%s/%s", g_dir, sub);
    if (mkdir(path, 0700) != 0) assert_int_equal(errno, EEXIST);
    if (name) snprintf(path + strlen(path), 512 - strlen(path), "/%s", name);
    return path;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

/* refit_hf_source_open(dir) fails with REFIT_ERR_IO and `needle`, leaving its
 * outputs alone. */
static void expect_refused(const char *dir, const char *needle)
{
    refit_model_t *model = t_model("tiny-moe");
    refit_hf_source_t *src = (refit_hf_source_t *)&src;
    refit_manifest_t *m = (refit_manifest_t *)&m;
    REFIT_ASSERT_ERR(refit_hf_source_open(dir, model, &src, &m), REFIT_ERR_IO, needle);
    assert_ptr_equal(src, (refit_hf_source_t *)&src);
    assert_ptr_equal(m, (refit_manifest_t *)&m);
    refit_model_destroy(model);
}

static void fifo_as_single_file(void **state)
{
    (void)state;
    alarm(ALARM_S);
    char p[512], dir[512];
    assert_int_equal(mkfifo(path_in("fifo1", "model.safetensors", p), 0600), 0);
    expect_refused(path_in("fifo1", NULL, dir), "model.safetensors is a FIFO, not a regular file");
    refit_safetensors_t *f = (refit_safetensors_t *)&f;
    REFIT_ASSERT_ERR(refit_safetensors_open(p, &f), REFIT_ERR_IO, "is a FIFO, not a regular file");
    assert_ptr_equal(f, (refit_safetensors_t *)&f);
    alarm(0);
}

static void fifo_as_index_or_shard(void **state)
{
    (void)state;
    alarm(ALARM_S);
    char p[512], dir[512];
    assert_int_equal(mkfifo(path_in("fifo2", "model.safetensors.index.json", p), 0600), 0);
    expect_refused(path_in("fifo2", NULL, dir), "model.safetensors.index.json is a FIFO, not a regular file");
    /* A regular index naming a shard that is a FIFO. */
    write_text(path_in("fifo3", "model.safetensors.index.json", p),
               "{\"metadata\": {}, \"weight_map\": {\"model.norm.weight\": \"model-00001-of-00001.safetensors\"}}");
    assert_int_equal(mkfifo(path_in("fifo3", "model-00001-of-00001.safetensors", p), 0600), 0);
    expect_refused(path_in("fifo3", NULL, dir), "model-00001-of-00001.safetensors is a FIFO, not a regular file");
    alarm(0);
}

static void device_and_directory(void **state)
{
    (void)state;
    alarm(ALARM_S);
    char p[512], dir[512];
    assert_int_equal(symlink("/dev/zero", path_in("dev", "model.safetensors", p)), 0);
    expect_refused(path_in("dev", NULL, dir), "model.safetensors is a character device, not a regular file");
    assert_int_equal(mkdir(path_in("isdir", "model.safetensors", p), 0700), 0);
    expect_refused(path_in("isdir", NULL, dir), "model.safetensors is a directory, not a regular file");
    assert_int_equal(symlink("/dev/zero", path_in("devidx", "model.safetensors.index.json", p)), 0);
    expect_refused(path_in("devidx", NULL, dir), "model.safetensors.index.json is a character device");
    alarm(0);
}

/* A regular file still opens (through a symbolic link too). */
static void regular_file_opens(void **state)
{
    (void)state;
    alarm(ALARM_S);
    char p[512], link[512];
    const char header[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    FILE *f = fopen(path_in("ok", "model.safetensors", p), "wb");
    assert_non_null(f);
    unsigned char len8[8] = {(unsigned char)(sizeof(header) - 1)};
    assert_int_equal(fwrite(len8, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, sizeof(header) - 1, f), sizeof(header) - 1);
    assert_int_equal(fwrite("\0\0\x80?\0\0\0@", 1, 8, f), 8);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(symlink(p, path_in("ok", "link.safetensors", link)), 0);
    const char *paths[] = {p, link};
    for (size_t i = 0; i < 2; i++) {
        refit_safetensors_t *st = NULL;
        REFIT_ASSERT_OK(refit_safetensors_open(paths[i], &st));
        assert_int_equal(refit_safetensors_count(st), 1);
        assert_int_equal(refit_safetensors_find(st, "w"), 0);
        refit_safetensors_close(st);
    }
    alarm(0);
}

/* The file at path holds exactly want (n bytes). */
static void assert_holds(const char *path, const char *want, size_t n)
{
    char buf[256] = {0};
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t got = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    assert_int_equal(got, n);
    assert_memory_equal(buf, want, n);
}

/* refit_safetensors_write never writes through a name someone else put in
 * its way: a symbolic link at the temporary name it used to use
 * ("<path>.tmp.<pid>", opened with fopen, which followed it and overwrote the
 * link's target), a link at the final name (replaced, not followed); and a
 * directory others may write is refused, naming it. */
static void dump_not_through_links(void **state)
{
    (void)state;
    alarm(ALARM_S);
    refit_manifest_t *m = t_manifest_named("tiny-moe", "vllm:tp=2", 0);
    uint64_t size = refit_manifest_region_size(m, 0);
    void *arena = calloc(1, size);
    assert_non_null(arena);
    const void *bases[1] = {arena};
    static const char precious[] = "the victim's own bytes\n";
    char victim[512], dst[512], tmp[600];
    FILE *f = fopen(path_in("victim", "file", victim), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(precious, 1, sizeof(precious) - 1, f), sizeof(precious) - 1);
    assert_int_equal(fclose(f), 0);
    path_in("dump", "model.safetensors", dst);
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", dst, (long)getpid());
    assert_int_equal(symlink(victim, tmp), 0);
    REFIT_ASSERT_OK(refit_safetensors_write(dst, m, bases));
    assert_holds(victim, precious, sizeof(precious) - 1);
    refit_safetensors_t *st = NULL;
    REFIT_ASSERT_OK(refit_safetensors_open(dst, &st));
    assert_true(refit_safetensors_count(st) > 0);
    refit_safetensors_close(st);
    /* A link at the final name: replaced by the file. */
    assert_int_equal(unlink(dst), 0);
    assert_int_equal(symlink(victim, dst), 0);
    REFIT_ASSERT_OK(refit_safetensors_write(dst, m, bases));
    assert_holds(victim, precious, sizeof(precious) - 1);
    struct stat sb;
    assert_int_equal(lstat(dst, &sb), 0);
    assert_true(S_ISREG(sb.st_mode));
    /* Only the dump and the planted link are left in the directory. */
    char dir[512];
    path_in("dump", NULL, dir);
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "test \"$(ls -A '%s' | wc -l)\" = 2", dir);
    assert_int_equal(system(cmd), 0);
    /* A directory group and others may write: refused before anything is written. */
    char open_dst[512];
    path_in("open", "model.safetensors", open_dst);
    char open_dir[512];
    assert_int_equal(chmod(path_in("open", NULL, open_dir), 0777), 0);
    REFIT_ASSERT_ERR(refit_safetensors_write(open_dst, m, bases), REFIT_ERR_AUTH, "writable by group or others");
    assert_int_equal(lstat(open_dst, &sb), -1);
    assert_int_equal(chmod(open_dir, 01777), 0); /* sticky, as /tmp, and ours: fine */
    REFIT_ASSERT_OK(refit_safetensors_write(open_dst, m, bases));
    free(arena);
    refit_manifest_destroy(m);
    alarm(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fifo_as_single_file),    cmocka_unit_test(fifo_as_index_or_shard),
        cmocka_unit_test(device_and_directory),   cmocka_unit_test(regular_file_opens),
        cmocka_unit_test(dump_not_through_links),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
