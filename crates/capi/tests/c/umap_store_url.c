/* A UMap program's file paged from a store (UPAGER_UMAP_STORE: UMap's own
 * programs, bfs among them, unchanged, over a Redis Cluster).
 * The file is uploaded with upager_store_load, then replaced by a
 * placeholder of its size (zeros), as a user who keeps the data only on
 * the cluster would. umap() of the placeholder serves the dataset's words,
 * records a warm-start trace on the cluster and replays it at the next
 * umap(); a writable umap() writes back to the cluster, never to the
 * placeholder; a placeholder of another size is refused (EINVAL, a message
 * naming both sizes); a file no entry names maps as a file.
 * The buffer (24 MiB) holds the gather's folios of 64 KiB, the cluster's
 * chunk, which the region's pages become (UMAP_PAGESIZE is 4 KiB).
 *   UMAP_BUFSIZE=6144 umap_store_url redis-cluster://HOST:PORT */
#include "common.h" /* first: it sets _GNU_SOURCE */

#include <umap/umap.h>
#include <upager.h>

#define LEN (32 * MIB)
#define PAGES (LEN / 4096)
#define TOUCH 300
#define WRITTEN (4 * MIB) /* bytes the writable umap() writes */

static uint64_t stat_of(const char *name) {
    uint64_t v = 0;
    CHECK(upager_umap_stat(name, &v) == 0, "stat %s", name);
    return v;
}

static int open_direct(const char *path, int flags) {
    int fd = open(path, flags | O_DIRECT);
    if (fd < 0 && errno == EINVAL) fd = open(path, flags); /* no O_DIRECT here */
    CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
    return fd;
}

/* umap()s the placeholder read-only, reads TOUCH scattered pages (checking
 * each against the dataset's words), uunmap()s; faults taken. */
static uint64_t gather(const char *path) {
    uint64_t before = stat_of("faults_missing");
    int fd = open_direct(path, O_RDONLY);
    volatile uint64_t *w = umap(NULL, LEN, PROT_READ, UMAP_PRIVATE, fd, 0);
    CHECK(w != UMAP_FAILED, "umap: %s: %s", strerror(errno), upager_last_error());
    read_scattered(w, PAGES, TOUCH);
    CHECK(uunmap((void *)w, LEN) == 0, "uunmap: %s", upager_last_error());
    close(fd);
    return stat_of("faults_missing") - before;
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: umap_store_url redis-cluster://HOST:PORT");
    char url[512], path[256], other[300], plain[300], plain_trace[320], env[1600];
    snprintf(url, sizeof url, "%s/c-umap-%d", argv[1], (int)getpid());
    snprintf(path, sizeof path, "%s/upager-umap-store-%d", scratch_dir(), (int)getpid());
    snprintf(other, sizeof other, "%s.other", path);
    snprintf(plain, sizeof plain, "%s.plain", path);
    /* UPAGER_WARM=on records the plain file's trace at its uunmap. */
    snprintf(plain_trace, sizeof plain_trace, "%s.upager-trace", plain);
    make_file(path, LEN);
    CHECK(upager_store_load(path, url, 65536) == 0, "upager_store_load: %s",
          upager_last_error());
    /* Placeholders: the data's size, and half of it; zeros only. */
    CHECK(truncate(path, 0) == 0 && truncate(path, LEN) == 0, "truncate");
    int ofd = open(other, O_CREAT | O_TRUNC | O_RDWR, 0600);
    CHECK(ofd >= 0 && ftruncate(ofd, LEN / 2) == 0, "placeholder %s", other);
    close(ofd);
    make_file(plain, MIB);
    /* Read at the first umap*() call, as UMap reads its variables. */
    snprintf(env, sizeof env, "%s=%s; %s=%s", path, url, other, url);
    setenv("UPAGER_UMAP_STORE", env, 1);
    setenv("UPAGER_WARM", "on", 1);

    /* Cold, recording; then replayed from the trace on the cluster. */
    uint64_t cold = gather(path);
    uint64_t replay0 = stat_of("replay_reads");
    CHECK(replay0 == 0, "nothing replayed the first time: %" PRIu64, replay0);
    uint64_t warm = gather(path);
    uint64_t replayed = stat_of("replay_reads");
    CHECK(replayed * 2 >= cold && warm * 4 <= cold,
          "faults: %" PRIu64 " cold, %" PRIu64 " replayed (%" PRIu64 " folios read ahead)",
          cold, warm, replayed);

    /* Writable: the writes go to the cluster, the placeholder stays zeros. */
    int fd = open_direct(path, O_RDWR);
    volatile uint64_t *w = umap(NULL, LEN, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
    CHECK(w != UMAP_FAILED, "writable umap: %s", upager_last_error());
    for (uint64_t i = 0; i < WRITTEN / 8; i++) {
        CHECK(w[i] == pattern(i), "word %" PRIu64 " is %#" PRIx64, i, w[i]);
        w[i] = written(i);
    }
    CHECK(uunmap((void *)w, LEN) == 0, "uunmap: %s", upager_last_error());
    w = umap(NULL, LEN, PROT_READ, UMAP_PRIVATE, fd, 0);
    CHECK(w != UMAP_FAILED, "umap again: %s", upager_last_error());
    for (uint64_t i = 0; i < LEN / 8; i += 61) {
        uint64_t want = i < WRITTEN / 8 ? written(i) : pattern(i);
        CHECK(w[i] == want, "after write-back, word %" PRIu64 " is %#" PRIx64, i, w[i]);
    }
    CHECK(uunmap((void *)w, LEN) == 0, "uunmap: %s", upager_last_error());
    close(fd);
    fd = open(path, O_RDONLY);
    uint64_t buf[512];
    for (uint64_t off = 0; off < WRITTEN; off += sizeof buf) {
        CHECK(pread(fd, buf, sizeof buf, off) == (ssize_t)sizeof buf, "pread");
        for (int k = 0; k < 512; k++)
            CHECK(buf[k] == 0, "the placeholder was written at %" PRIu64, off);
    }
    close(fd);

    /* A placeholder of another size: refused, nothing mapped. */
    fd = open_direct(other, O_RDONLY);
    errno = 0;
    CHECK(umap(NULL, LEN / 2, PROT_READ, UMAP_PRIVATE, fd, 0) == UMAP_FAILED &&
              errno == EINVAL,
          "a placeholder of another size was mapped (errno %d)", errno);
    CHECK(strstr(upager_last_error(), "not the same data") != NULL, "message: %s",
          upager_last_error());
    close(fd);

    /* A file no entry names is a file. */
    fd = open_direct(plain, O_RDONLY);
    w = umap(NULL, MIB, PROT_READ, UMAP_PRIVATE, fd, 0);
    CHECK(w != UMAP_FAILED, "umap of a plain file: %s", upager_last_error());
    CHECK(w[0] == pattern(0) && w[MIB / 8 - 1] == pattern(MIB / 8 - 1), "plain file's words");
    CHECK(uunmap((void *)w, MIB) == 0, "uunmap");
    close(fd);

    CHECK(upager_store_delete(url) == 0, "upager_store_delete: %s", upager_last_error());
    unlink(path);
    unlink(other);
    unlink(plain);
    CHECK(unlink(plain_trace) == 0, "the plain file's trace %s: %s", plain_trace, strerror(errno));
    printf("umap_store_url: %" PRIu64 " faults cold, %" PRIu64 " replayed (%" PRIu64
           " folios read ahead); writes on the cluster, none in the placeholder\n",
           cold, warm, replayed);
    return 0;
}
