/* upager_options.huge_runs: mixed folio sizes, and
 * upager_options.readahead_async. Default -1 (huge_runs off, readahead_async on);
 * another value than -1, 0, 1 is -EINVAL naming the field. With 1,
 * sequential passes over a writable file region of 4 KiB folios
 * fill 2 MiB runs as huge pages (counter thp_fills); with 0, none. The
 * data read is the file's either way. */
#include "common.h" /* first: it sets _GNU_SOURCE */

#include <time.h>

#include <upager.h>

#define FILE_BYTES (64 * MIB)

/* Passes over the region (one word per page, checked) until thp_fills is
 * non-zero or `passes` are done; returns thp_fills. */
static uint64_t scan(upager_t *pg, upager_region_t *r, int passes) {
    const volatile uint64_t *w = upager_region_addr(r);
    uint64_t fills = 0;
    for (int p = 0; p < passes && fills == 0; p++) {
        for (uint64_t i = 0; i < FILE_BYTES / 8; i += 512)
            CHECK(w[i] == pattern(i), "word %" PRIu64, i);
        CHECK(upager_stat(pg, "thp_fills", &fills) == 0, "stat");
    }
    return fills;
}

static uint64_t run(const char *path, int huge_runs) {
    struct upager_options po;
    upager_options_init(&po);
    po.budget = 32 * MIB;
    po.huge_runs = huge_runs;
    upager_t *pg = NULL;
    CHECK(upager_create(&po, &pg) == 0, "create: %s", upager_last_error());
    struct upager_map_options mo;
    upager_map_options_init(&mo);
    mo.flags = UPAGER_MAP_WRITE;
    mo.folio = 4096;
    upager_region_t *r = NULL;
    CHECK(upager_map_file(pg, path, &mo, &r) == 0, "map: %s", upager_last_error());
    uint64_t fills = scan(pg, r, huge_runs == 1 ? 20 : 2);
    CHECK(upager_unmap(r, 0) == 0, "unmap: %s", upager_last_error());
    upager_destroy(pg);
    return fills;
}

int main(void) {
    char path[] = "/dev/shm/upager-huge-runs-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    make_file(path, FILE_BYTES);

    struct upager_options po;
    upager_options_init(&po);
    CHECK(po.huge_runs == -1, "default is -1, got %d", po.huge_runs);
    po.huge_runs = 2;
    upager_t *pg = NULL;
    int rc = upager_create(&po, &pg);
    CHECK(rc == -EINVAL && strstr(upager_last_error(), "huge_runs"),
          "huge_runs 2: rc %d, message %s", rc, upager_last_error());
    /* readahead_async takes the same -1/0/1. */
    upager_options_init(&po);
    CHECK(po.readahead_async == -1, "readahead_async default is -1, got %d",
          po.readahead_async);
    po.readahead_async = 2;
    rc = upager_create(&po, &pg);
    CHECK(rc == -EINVAL && strstr(upager_last_error(), "readahead_async"),
          "readahead_async 2: rc %d, message %s", rc, upager_last_error());

    CHECK(run(path, 0) == 0, "huge_runs 0 filled huge pages");
    CHECK(run(path, -1) == 0, "the default (off) filled huge pages");
    CHECK(run(path, 1) > 0, "huge_runs 1 filled no huge run in 20 passes");
    unlink(path);
    printf("huge_runs: ok\n");
    return 0;
}
