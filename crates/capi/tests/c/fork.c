/* fork() with upager.h: a child uses the file region it
 * inherited at the same address. The parent writes folio 0 before the
 * fork (flushed by the fork handler, so the child sees it); the child
 * checks that and the pattern, writes folio 1, and forks a grandchild that
 * writes folio 2; a thread that is not the main one forks a child that
 * writes folio 3; children end with _exit (no parent destructor runs). The
 * parent writes folio 4 after the forks. Every write is in the file at the
 * end. Every wait has a timeout; an overdue child is killed. */
#include "common.h" /* first: it sets _GNU_SOURCE */

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <upager.h>

#define FOLIO (64u * 1024u)
#define FW (FOLIO / 8) /* words per folio */

static uint64_t *base;
static uint64_t nwords;
static upager_region_t *region;

static uint64_t mark(uint64_t who, uint64_t i) { return (who << 56) | i; }

static void write_folio(uint64_t who, uint64_t f) {
    for (uint64_t w = 0; w < FW; w++) base[f * FW + w] = mark(who, f * FW + w);
}

/* Words of folio f are who's marks (who != 0) or the pattern (who == 0). */
static int folio_is(uint64_t f, uint64_t who) {
    for (uint64_t w = 0; w < FW; w++) {
        uint64_t i = f * FW + w;
        uint64_t want = who ? mark(who, i) : pattern(i);
        if (base[i] != want) {
            fprintf(stderr, "pid %d: word %" PRIu64 " = %#" PRIx64
                    ", want %#" PRIx64 "\n", (int)getpid(), i, base[i], want);
            return 0;
        }
    }
    return 1;
}

/* Exit code of child `pid`, waiting at most `secs`; kills it after that. */
static int reap(pid_t pid, int secs) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int status = 0;
        pid_t r = waitpid(pid, &status, WNOHANG);
        CHECK(r >= 0, "waitpid: %s", strerror(errno));
        if (r == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status)
                                     : 128 + WTERMSIG(status);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > secs) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            CHECK(0, "child %d overdue: killed", (int)pid);
        }
        usleep(5000);
    }
}

static void *fork_from_thread(void *arg) {
    (void)arg;
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        int ok = folio_is(3, 0);
        write_folio(3, 3);
        ok = ok && upager_flush(region) == 0;
        _exit(ok ? 0 : 1);
    }
    return (void *)(intptr_t)reap(pid, 60);
}

int main(void) {
    const uint64_t size = 16 * MIB, budget = 2 * MIB;
    char path[256];
    snprintf(path, sizeof path, "%s/upager-capi-fork-%d", scratch_dir(),
             (int)getpid());
    make_file(path, size);
    struct upager_options po;
    upager_options_init(&po);
    po.budget = budget;
    upager_t *pg = NULL;
    CHECK(upager_create(&po, &pg) == 0, "create: %s", upager_last_error());
    struct upager_map_options mo;
    upager_map_options_init(&mo);
    mo.flags = UPAGER_MAP_WRITE;
    mo.folio = FOLIO;
    CHECK(upager_map_file(pg, path, &mo, &region) == 0, "map: %s",
          upager_last_error());
    base = upager_region_addr(region);
    nwords = size / 8;

    write_folio(1, 0); /* not flushed: the fork handler does it */
    pid_t child = fork();
    CHECK(child >= 0, "fork");
    if (child == 0) {
        int ok = folio_is(0, 1) && folio_is(5, 0);
        for (uint64_t f = 6; ok && f < nwords / FW; f++) ok = folio_is(f, 0);
        write_folio(2, 1);
        pid_t grand = fork();
        if (grand == 0) {
            int gok = folio_is(1, 2) && folio_is(0, 1);
            write_folio(3, 2);
            gok = gok && upager_flush(region) == 0;
            _exit(gok ? 0 : 1);
        }
        ok = ok && grand > 0 && reap(grand, 60) == 0;
        ok = ok && upager_flush(region) == 0;
        _exit(ok ? 0 : 1);
    }
    pthread_t t;
    CHECK(pthread_create(&t, NULL, fork_from_thread, NULL) == 0, "thread");
    write_folio(1, 4);
    void *thread_code;
    pthread_join(t, &thread_code);
    CHECK((intptr_t)thread_code == 0, "the thread's child failed: %d",
          (int)(intptr_t)thread_code);
    CHECK(reap(child, 120) == 0, "the child (or grandchild) failed");
    CHECK(upager_flush(region) == 0, "flush");

    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0, "open");
    uint64_t *buf = malloc(size);
    CHECK(pread(fd, buf, size, 0) == (ssize_t)size, "pread");
    close(fd);
    const uint64_t who[5] = {1, 2, 3, 3, 1}; /* writer of folios 0-4 */
    for (uint64_t i = 0; i < nwords; i++) {
        uint64_t f = i / FW;
        uint64_t want = f < 5 ? mark(who[f], i) : pattern(i);
        CHECK(buf[i] == want, "file word %" PRIu64 " = %#" PRIx64
              ", want %#" PRIx64, i, buf[i], want);
    }
    free(buf);
    CHECK(upager_unmap(region, 0) == 0, "unmap");
    upager_destroy(pg);
    unlink(path);
    printf("fork: parent, child, grandchild and a thread's child all wrote\n");
    return 0;
}
