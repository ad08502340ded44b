/* UMap drop-in warm starts: with UPAGER_WARM=on in the environment, a
 * umap() of a file records the order its pages are first needed beside the
 * file (FILE.upager-trace, written at uunmap) and the next umap() of it
 * replays that order as prefetch. The descriptor is opened with O_DIRECT,
 * as UMap's own programs (bfs, umapsort) open theirs.
 *   UPAGER_WARM=on UMAP_BUFSIZE=2048 umap_warm */
#include "common.h" /* first: it sets _GNU_SOURCE */

#include <umap/umap.h>
#include <upager.h>

#define FILE_BYTES (32 * MIB)
#define FOLIOS (FILE_BYTES / 4096)
#define TOUCH 2000

/* umap()s `path`, reads one word of TOUCH scattered pages in a fixed order
 * (checking each), uunmap()s; the drop-in pager's `name` counter after. */
static uint64_t gather(const char *path, const char *name) {
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0 && errno == EINVAL) fd = open(path, O_RDONLY); /* no O_DIRECT here */
    CHECK(fd >= 0, "open %s", path);
    volatile uint64_t *w = umap(NULL, FILE_BYTES, PROT_READ, UMAP_PRIVATE, fd, 0);
    CHECK(w != UMAP_FAILED, "umap: %s", strerror(errno));
    read_scattered(w, FOLIOS, TOUCH);
    CHECK(uunmap((void *)w, FILE_BYTES) == 0, "uunmap");
    close(fd);
    uint64_t v = 0;
    CHECK(upager_umap_stat(name, &v) == 0, "stat %s", name);
    return v;
}

int main(void) {
    const char *on = getenv("UPAGER_WARM");
    CHECK(on && strcmp(on, "on") == 0, "run with UPAGER_WARM=on");
    char path[256], trace[300];
    snprintf(path, sizeof path, "%s/upager-umap-warm-%d", scratch_dir(), (int)getpid());
    snprintf(trace, sizeof trace, "%s.upager-trace", path);
    make_file(path, FILE_BYTES);

    uint64_t faults0 = gather(path, "faults_missing");
    CHECK(access(trace, F_OK) == 0, "the first umap recorded %s", trace);
    uint64_t replay0 = 0, faults1 = 0, replay1 = 0;
    CHECK(upager_umap_stat("replay_reads", &replay0) == 0, "stat");
    CHECK(replay0 == 0, "nothing replayed the first time: %" PRIu64, replay0);
    faults1 = gather(path, "faults_missing") - faults0;
    CHECK(upager_umap_stat("replay_reads", &replay1) == 0, "stat");
    CHECK(replay1 >= TOUCH * 3 / 4, "replay read %" PRIu64 " pages", replay1);
    CHECK(faults1 * 4 <= faults0, "faults: %" PRIu64 " cold, %" PRIu64 " replayed",
          faults0, faults1);
    unlink(trace);
    unlink(path);
    printf("umap_warm: %" PRIu64 " faults cold, %" PRIu64 " replayed (%" PRIu64
           " pages read ahead)\n", faults0, faults1, replay1);
    return 0;
}
