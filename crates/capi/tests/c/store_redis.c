/* A Redis Cluster store from C: upager_store_load uploads a
 * dataset, upager_map_file(pager, NULL, opts) with opts.store maps it by
 * name (read-write under a budget a quarter of its size: every word right,
 * writes back on the cluster after flush + unmap, seen by a second mapping),
 * upager_map_anonymous with opts.store swaps to the cluster (far memory), and
 * each misuse is a clear negative errno with a message; upager_store_list
 * shows the dataset (complete, its size) and upager_store_delete removes it;
 * loading a directory writes nothing.
 *   store_redis redis-cluster://127.0.0.1:PORT */
#include "common.h"
#include <upager.h>

#define LEN (8 * MIB)

static void check_rc(int rc, int want, const char *what) {
    CHECK(rc == want, "%s returned %d (%s), expected %d: %s", what, rc,
          upager_strerror(rc), want, upager_last_error());
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: store_redis redis-cluster://HOST:PORT");
    char url[512], path[256];
    snprintf(url, sizeof url, "%s/c-test-%d", argv[1], (int)getpid());
    const char *dir = getenv("UPAGER_TEST_DIR") ? getenv("UPAGER_TEST_DIR")
                                                  : "/dev/shm";
    snprintf(path, sizeof path, "%s/upager-store-redis-%d", dir, (int)getpid());
    make_file(path, LEN);

    /* Upload; a second upload under the same name is refused. */
    check_rc(upager_store_load(path, url, 65536), 0, "upager_store_load");
    check_rc(upager_store_load(path, url, 65536), -EEXIST, "second load");
    CHECK(strstr(upager_last_error(), "exists") != NULL, "%s",
          upager_last_error());
    unlink(path);

    struct upager_options po;
    upager_options_init(&po);
    po.budget = LEN / 4;
    upager_t *pg;
    check_rc(upager_create(&po, &pg), 0, "upager_create");

    /* Map by name, read-write: read every word, write every 8th. */
    struct upager_map_options mo;
    upager_map_options_init(&mo);
    mo.flags = UPAGER_MAP_WRITE;
    mo.store = url;
    upager_region_t *r;
    check_rc(upager_map_file(pg, NULL, &mo, &r), 0, "map dataset");
    CHECK(upager_region_length(r) == LEN, "length %" PRIu64, upager_region_length(r));
    uint64_t *w = upager_region_addr(r);
    for (uint64_t i = 0; i < LEN / 8; i++) {
        CHECK(w[i] == pattern(i), "word %" PRIu64 " is %#" PRIx64, i, w[i]);
        if (i % 8 == 0) w[i] = ~pattern(i);
    }
    check_rc(upager_flush(r), 0, "upager_flush");
    check_rc(upager_unmap(r, 0), 0, "upager_unmap");

    /* A second mapping, read-only, sees every write. */
    mo.flags = 0;
    check_rc(upager_map_file(pg, NULL, &mo, &r), 0, "map again");
    w = upager_region_addr(r);
    for (uint64_t i = 0; i < LEN / 8; i++)
        CHECK(w[i] == written(i), "after remap word %" PRIu64 " is %#" PRIx64,
              i, w[i]);
    check_rc(upager_unmap(r, 0), 0, "unmap");

    /* Far memory: 4x the budget, swapped to the cluster. */
    upager_map_options_init(&mo);
    mo.store = argv[1];
    check_rc(upager_map_anonymous(pg, LEN, &mo, &r), 0, "map_anonymous");
    w = upager_region_addr(r);
    for (uint64_t i = 0; i < LEN / 8; i += 64) w[i] = pattern(i);
    for (uint64_t i = 0; i < LEN / 8; i++)
        CHECK(w[i] == (i % 64 == 0 ? pattern(i) : 0),
              "far memory word %" PRIu64 " is %#" PRIx64, i, w[i]);
    uint64_t wb = 0;
    check_rc(upager_region_stat(r, "writebacks", &wb), 0, "stat");
    CHECK(wb > 0, "nothing was swapped to the cluster");
    check_rc(upager_unmap(r, 0), 0, "unmap far memory");

    /* Misuse: each a clear error, nothing mapped. */
    upager_map_options_init(&mo);
    mo.store = url;
    check_rc(upager_map_file(pg, "/etc/hostname", &mo, &r), -EINVAL,
             "path and store");
    mo.folio = 16384; /* the dataset's chunk is 64 KiB */
    check_rc(upager_map_file(pg, NULL, &mo, &r), -EINVAL, "folio < chunk");
    CHECK(strstr(upager_last_error(), "chunk") != NULL, "%s",
          upager_last_error());
    mo.folio = 0;
    mo.store = "redis://127.0.0.1:7000/x";
    check_rc(upager_map_file(pg, NULL, &mo, &r), -EINVAL, "bad scheme");
    CHECK(strstr(upager_last_error(), "redis-cluster://") != NULL, "%s",
          upager_last_error());
    mo.store = "redis-cluster://127.0.0.1:1/x";
    check_rc(upager_map_file(pg, NULL, &mo, &r), -ECONNREFUSED, "unreachable");
    CHECK(strstr(upager_last_error(), "127.0.0.1:1") != NULL, "%s",
          upager_last_error());
    /* Credentials pass through as given; no message prints the password
       (a URL in a message shows it as ***). */
    mo.store = "redis-cluster://alice:hunter2%40x@127.0.0.1:1/x";
    check_rc(upager_map_file(pg, NULL, &mo, &r), -ECONNREFUSED,
             "unreachable, with credentials");
    CHECK(strstr(upager_last_error(), "hunter2") == NULL, "%s",
          upager_last_error());
    check_rc(upager_store_list("redis://:hunter2@x:1", NULL, 0), -EINVAL,
             "list bad URL with a password");
    CHECK(strstr(upager_last_error(), "'redis://:***@x:1'") != NULL, "%s",
          upager_last_error());
    char missing[600];
    snprintf(missing, sizeof missing, "%s/no-such-dataset-%d", argv[1],
             (int)getpid());
    mo.store = missing;
    check_rc(upager_map_file(pg, NULL, &mo, &r), -ENOENT, "missing dataset");
    check_rc(upager_map_fd(pg, 0, &mo, &r), -EINVAL, "fd and store");

    /* list shows the dataset, complete and of its size; delete removes
       it, and a second delete is -ENOENT naming it. */
    char name[64];
    snprintf(name, sizeof name, "c-test-%d", (int)getpid());
    int n = upager_store_list(argv[1], NULL, 0);
    CHECK(n >= 1, "upager_store_list returned %d: %s", n, upager_last_error());
    struct upager_dataset *ds = calloc((size_t)n, sizeof *ds);
    CHECK(ds != NULL, "calloc");
    check_rc(upager_store_list(argv[1], ds, (size_t)n), n, "upager_store_list");
    int found = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(ds[i].name, name) == 0) {
            found = 1;
            CHECK(ds[i].length == LEN && ds[i].chunk == 65536 && ds[i].complete == 1,
                  "listed %s: length %" PRIu64 " chunk %" PRIu64 " complete %d",
                  ds[i].name, ds[i].length, ds[i].chunk, ds[i].complete);
        }
    CHECK(found, "%s is not listed", name);
    free(ds);
    check_rc(upager_store_delete(url), 0, "upager_store_delete");
    check_rc(upager_store_delete(url), -ENOENT, "second delete");
    CHECK(strstr(upager_last_error(), name) != NULL, "%s", upager_last_error());
    mo.store = url;
    mo.flags = 0;
    check_rc(upager_map_file(pg, NULL, &mo, &r), -ENOENT, "map deleted dataset");
    check_rc(upager_store_list("redis://x:1", NULL, 0), -EINVAL, "list bad URL");
    /* A directory: refused, nothing written, the name stays free. */
    check_rc(upager_store_load(dir, url, 65536), -EISDIR, "load a directory");
    CHECK(strstr(upager_last_error(), "directory") != NULL, "%s",
          upager_last_error());
    n = upager_store_list(argv[1], NULL, 0);
    ds = calloc((size_t)n + 1, sizeof *ds);
    CHECK(ds != NULL, "calloc");
    check_rc(upager_store_list(argv[1], ds, (size_t)n), n, "list after");
    for (int i = 0; i < n; i++)
        CHECK(strcmp(ds[i].name, name) != 0, "%s is still listed", name);
    free(ds);

    upager_destroy(pg);
    printf("store_redis: dataset, far memory, errors, list and delete OK\n");
    return 0;
}
