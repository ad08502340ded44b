/* upager_options.dirty_expire_ms: data dirty for longer
 * than the expiry is written back in the background, so plain reads of the
 * file see it without upager_flush(); a negative value other than -1 is
 * -EINVAL with a message naming the field. And upager_invalidate: a
 * second region of the file sees those writes once it drops its
 * clean copy. */
#include "common.h" /* first: it sets _GNU_SOURCE */

#include <time.h>

#include <upager.h>

#define FILE_BYTES (4 * MIB)

int main(void) {
    char path[] = "/dev/shm/upager-dirty-expire-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    make_file(path, FILE_BYTES);

    struct upager_options po;
    upager_options_init(&po);
    CHECK(po.dirty_expire_ms == -1, "default is -1, got %" PRId64, po.dirty_expire_ms);
    po.dirty_expire_ms = -2;
    upager_t *pg = NULL;
    int rc = upager_create(&po, &pg);
    CHECK(rc == -EINVAL && strstr(upager_last_error(), "dirty_expire_ms"),
          "dirty_expire_ms -2: rc %d, message %s", rc, upager_last_error());

    po.dirty_expire_ms = 200;
    po.budget = 16 * MIB;
    CHECK(upager_create(&po, &pg) == 0, "create: %s", upager_last_error());
    struct upager_map_options mo;
    upager_map_options_init(&mo);
    mo.flags = UPAGER_MAP_WRITE;
    upager_region_t *r = NULL;
    CHECK(upager_map_file(pg, path, &mo, &r) == 0, "map: %s", upager_last_error());
    upager_region_t *r2 = NULL;
    CHECK(upager_map_file(pg, path, &mo, &r2) == 0, "map 2: %s", upager_last_error());
    volatile uint64_t *w2 = upager_region_addr(r2);
    CHECK(w2[0] == pattern(0), "second region reads the file");
    volatile uint64_t *w = upager_region_addr(r);
    for (uint64_t i = 0; i < FILE_BYTES / 8; i += 8) w[i] = ~pattern(i);
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    uint64_t aged = 0;
    CHECK(upager_stat(pg, "writebacks_aged", &aged) == 0, "stat");
    CHECK(aged > 0, "writebacks_aged is 0 after 1 s with a 200 ms expiry");
    verify_file(path, FILE_BYTES, 1); /* no flush: the background writer */
    CHECK(w2[0] == pattern(0), "the second region keeps its clean copy");
    int64_t dropped = upager_invalidate(r2, 0, FILE_BYTES);
    CHECK(dropped >= 1, "upager_invalidate: %" PRId64 " (%s)", dropped, upager_last_error());
    CHECK(w2[0] == ~pattern(0), "after invalidate the second region reads the file");
    CHECK(upager_invalidate(r2, FILE_BYTES, 1) == -EINVAL, "beyond the region");
    CHECK(upager_unmap(r2, 0) == 0, "unmap 2: %s", upager_last_error());
    CHECK(upager_unmap(r, 0) == 0, "unmap: %s", upager_last_error());
    upager_destroy(pg);
    unlink(path);
    printf("dirty_expire: %" PRIu64 " folios written back by age\n", aged);
    return 0;
}
