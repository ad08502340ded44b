/* Issue 20, item 4: two reader threads read a region while the main thread
 * unmaps it. Every read must give the right data or SIGSEGV (as with
 * munmap), never SIGBUS: in the in-thread mode a SIGBUS raised just before
 * the range became inaccessible used to be handled after the region had
 * left the registry, was passed on as foreign, and killed the process
 * (3 of 4 runs). Each run is a child process (an alarm bounds it); the
 * parent checks how it ended. Both fault modes, RUNS runs each. */
#include "common.h" /* first: it sets _GNU_SOURCE */

#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>

#include <upager.h>

#define FILE_BYTES (64 * MIB)
#define RUNS 12

static __thread sigjmp_buf jump;
static __thread int armed;
static atomic_int unmapped;

static void on_segv(int sig) {
    (void)sig;
    if (armed) siglongjmp(jump, 1);
    signal(SIGSEGV, SIG_DFL);
}

struct reader {
    volatile uint64_t *base;
    unsigned seed;
    uint64_t reads, segv, wrong, after;
};

static void *reader(void *arg) {
    struct reader *r = arg;
    uint64_t words = FILE_BYTES / 8;
    if (sigsetjmp(jump, 1)) {
        r->segv++;
        return NULL; /* the range is gone: done */
    }
    armed = 1;
    for (;;) {
        uint64_t i = (uint64_t)rand_r(&r->seed) * 7919 % words;
        int before = atomic_load(&unmapped);
        uint64_t v = r->base[i];
        if (v != pattern(i) && !before) r->wrong++;
        r->reads++;
        /* The range was unmapped and reused without a SIGSEGV reaching
         * this thread (another mapping took the addresses): stop. */
        if (before && ++r->after > 1000000) break;
    }
    return NULL;
}

static int child(int mode, const char *path, unsigned seed) {
    alarm(30);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_segv;
    sa.sa_flags = SA_NODEFER;
    sigaction(SIGSEGV, &sa, NULL);
    struct upager_options po;
    upager_options_init(&po);
    po.budget = 16 * MIB;
    po.fault_mode = mode;
    upager_t *pg = NULL;
    CHECK(upager_create(&po, &pg) == 0, "create: %s", upager_last_error());
    struct upager_map_options mo;
    upager_map_options_init(&mo);
    mo.folio = 4096;
    upager_region_t *reg = NULL;
    CHECK(upager_map_file(pg, path, &mo, &reg) == 0, "map: %s", upager_last_error());
    struct reader rd[2] = {{.base = upager_region_addr(reg), .seed = seed},
                           {.base = upager_region_addr(reg), .seed = seed * 31 + 7}};
    pthread_t th[2];
    for (int t = 0; t < 2; t++) pthread_create(&th[t], NULL, reader, &rd[t]);
    struct timespec ts = {0, (long)(1 + seed % 20) * 1000000L};
    nanosleep(&ts, NULL);
    CHECK(upager_unmap(reg, 0) == 0, "unmap: %s", upager_last_error());
    atomic_store(&unmapped, 1);
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < 2; t++) {
        CHECK(rd[t].wrong == 0, "reader %d read %" PRIu64 " wrong words", t, rd[t].wrong);
    }
    upager_destroy(pg);
    return 0;
}

static char path[] = "/dev/shm/upager-unmap-race-XXXXXX";
static pid_t parent;
/* A failed CHECK exits: the data file goes too (not from the children). */
static void remove_file(void) {
    if (getpid() == parent) unlink(path);
}

int main(void) {
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    parent = getpid();
    atexit(remove_file);
    make_file(path, FILE_BYTES);
    int modes[2] = {UPAGER_FAULT_HANDLERS, UPAGER_FAULT_IN_THREAD};
    for (int m = 0; m < 2; m++) {
        for (unsigned run = 0; run < RUNS; run++) {
            pid_t pid = fork();
            CHECK(pid >= 0, "fork");
            if (pid == 0) _exit(child(modes[m], path, 1000 * m + run + 1));
            int st = 0;
            CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "mode %d run %u: child ended by %s %d", modes[m], run,
                  WIFSIGNALED(st) ? "signal" : "exit status",
                  WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        }
    }
    printf("unmap_race: %d runs per mode, every read right or SIGSEGV\n", RUNS);
    return 0;
}
