/* Warm starts from C: UPAGER_MAP_WARM records the order a region's folios
 * are first needed beside the file (FILE.upager-trace) and replays it as
 * prefetch the next time; UPAGER_MAP_WARM_RECORD records anew; an unknown
 * flag is -EINVAL. */
#include "common.h" /* first: it sets _GNU_SOURCE */


#include <upager.h>

#define FILE_BYTES (32 * MIB)
#define FOLIOS (FILE_BYTES / 4096)
#define TOUCH 2000

/* Maps `path` with `flags`, reads one word of TOUCH scattered folios in a
 * fixed order (checking each), unmaps; the pager's `name` counter. */
static uint64_t gather(const char *path, uint32_t flags, const char *name) {
    struct upager_options po;
    upager_options_init(&po);
    po.budget = 16 * MIB;
    upager_t *pg = NULL;
    CHECK(upager_create(&po, &pg) == 0, "create: %s", upager_last_error());
    struct upager_map_options mo;
    upager_map_options_init(&mo);
    mo.flags = flags;
    upager_region_t *r = NULL;
    CHECK(upager_map_file(pg, path, &mo, &r) == 0, "map: %s", upager_last_error());
    volatile uint64_t *w = upager_region_addr(r);
    read_scattered(w, FOLIOS, TOUCH);
    CHECK(upager_unmap(r, 0) == 0, "unmap: %s", upager_last_error());
    uint64_t v = 0;
    CHECK(upager_stat(pg, name, &v) == 0, "stat %s", name);
    upager_destroy(pg);
    return v;
}

int main(void) {
    char path[] = "/dev/shm/upager-warm-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    make_file(path, FILE_BYTES);
    char trace[sizeof path + 32];
    snprintf(trace, sizeof trace, "%s.upager-trace", path);

    struct upager_map_options mo;
    upager_map_options_init(&mo);
    mo.flags = 8;
    upager_t *pg = NULL;
    struct upager_options po;
    upager_options_init(&po);
    CHECK(upager_create(&po, &pg) == 0, "create");
    upager_region_t *r = NULL;
    CHECK(upager_map_file(pg, path, &mo, &r) == -EINVAL &&
              strstr(upager_last_error(), "map flags"),
          "flag 8: %s", upager_last_error());
    upager_destroy(pg);

    uint64_t cold = gather(path, 0, "faults_missing");
    CHECK(access(trace, F_OK) != 0, "no trace without UPAGER_MAP_WARM");
    CHECK(gather(path, UPAGER_MAP_WARM, "replay_reads") == 0, "nothing to replay yet");
    CHECK(access(trace, F_OK) == 0, "UPAGER_MAP_WARM recorded %s", trace);
    uint64_t replayed = gather(path, UPAGER_MAP_WARM, "replay_reads");
    uint64_t faults = gather(path, UPAGER_MAP_WARM, "faults_missing");
    CHECK(replayed >= TOUCH * 3 / 4, "replay read %" PRIu64 " folios", replayed);
    CHECK(faults * 4 <= cold, "faults: %" PRIu64 " cold, %" PRIu64 " replayed", cold, faults);
    CHECK(gather(path, UPAGER_MAP_WARM | UPAGER_MAP_WARM_RECORD, "replay_reads") == 0,
          "UPAGER_MAP_WARM_RECORD records, not replays");
    unlink(trace);
    unlink(path);
    printf("warm: %" PRIu64 " faults cold, %" PRIu64 " replayed (%" PRIu64 " folios read ahead)\n",
           cold, faults, replayed);
    return 0;
}
