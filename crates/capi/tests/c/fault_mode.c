/* upager_options.fault_mode: upager_options_init fills it from
 * UPAGER_FAULT_MODE, the mode reaches the pager (upager_fault_mode, and
 * faults are counted where that mode takes them), a bad value is -EINVAL
 * with a message naming the choices (and the variable, when it came from
 * the environment), and upager_fault_in makes region memory usable by a
 * system call in the in-thread mode, where it is EFAULT before.
 * The harness runs it with UPAGER_FAULT_MODE unset and set: the defaults
 * (upager_create(NULL, ...)) must follow the variable. */
#include "common.h" /* first: it sets _GNU_SOURCE */

#include <upager.h>

#define BUDGET (8 * MIB)
#define FILE_BYTES (64 * MIB)

/* rc must be -err and the last message must contain `text`. */
static void expect(int rc, int err, const char *text, const char *what) {
    CHECK(rc == -err, "%s: got %d (%s), expected -%d (%s); message: %s",
          what, rc, upager_strerror(rc), err, upager_strerror(err),
          upager_last_error());
    CHECK(strstr(upager_last_error(), text), "%s: message \"%s\" lacks \"%s\"",
          what, upager_last_error(), text);
}

/* What init must make of a value of UPAGER_FAULT_MODE (NULL: unset). */
static int mode_for(const char *v) {
    if (!v || !*v) return UPAGER_FAULT_FROM_ENV; /* upager chooses */
    if (!strcmp(v, "handlers")) return UPAGER_FAULT_HANDLERS;
    if (!strcmp(v, "in-thread")) return UPAGER_FAULT_IN_THREAD;
    return UPAGER_FAULT_FROM_ENV;
}

static uint64_t stat_of(const upager_t *pg, const char *name) {
    uint64_t v = 0;
    int rc = upager_stat(pg, name, &v);
    CHECK(rc == 0, "upager_stat(%s): %s", name, upager_last_error());
    return v;
}

static upager_t *create(int mode) {
    struct upager_options po;
    upager_options_init(&po);
    po.budget = BUDGET;
    po.fault_mode = mode;
    upager_t *pg = NULL;
    int rc = upager_create(&po, &pg);
    CHECK(rc == 0, "create with fault_mode %d: %s", mode, upager_last_error());
    CHECK(upager_fault_mode(pg) == mode, "upager_fault_mode %d, asked for %d",
          upager_fault_mode(pg), mode);
    return pg;
}

/* Reads and writes a file 8x the budget from 2 threads in `mode`; the
 * counters show which mode took the faults. */
static void work_in(int mode, const char *path) {
    upager_t *pg = create(mode);
    struct upager_map_options mo;
    upager_map_options_init(&mo);
    mo.flags = UPAGER_MAP_WRITE;
    mo.folio = 4096;
    upager_region_t *r = NULL;
    CHECK(upager_map_file(pg, path, &mo, &r) == 0, "map: %s",
          upager_last_error());
    run_workers(upager_region_addr(r), 0, FILE_BYTES / 8, 2, WRITE);
    CHECK(upager_unmap(r, 0) == 0, "unmap: %s", upager_last_error());
    verify_file(path, FILE_BYTES, 1);
    uint64_t missing = stat_of(pg, "faults_missing");
    uint64_t in_thread = stat_of(pg, "faults_in_thread");
    uint64_t evictions = stat_of(pg, "evictions");
    CHECK(missing > 0 && evictions > 0, "faults %" PRIu64 ", evictions %" PRIu64,
          missing, evictions);
    if (mode == UPAGER_FAULT_IN_THREAD)
        CHECK(in_thread > 0, "in-thread mode took no in-thread faults "
              "(%" PRIu64 " missing faults)", missing);
    else
        CHECK(in_thread == 0, "handlers mode took %" PRIu64 " in-thread faults",
              in_thread);
    CHECK(stat_of(pg, "resident_peak_bytes") <= BUDGET, "budget exceeded");
    upager_destroy(pg);
    make_file(path, FILE_BYTES); /* the pattern again, for the next run */
}

/* write(2) from a never-touched range of a region: EFAULT in in-thread
 * mode, until upager_fault_in() has made the range resident; works at
 * once with handler threads. */
static void syscall_on_region(int mode, const char *path, const char *out) {
    upager_t *pg = create(mode);
    upager_region_t *r = NULL;
    CHECK(upager_map_file(pg, path, NULL, &r) == 0, "map: %s",
          upager_last_error());
    char *base = upager_region_addr(r);
    size_t n = 256 * 1024, off = 4 * MIB;
    int fd = open(out, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    CHECK(fd >= 0, "open %s", out);
    ssize_t w = write(fd, base + off, n);
    /* System calls fault pages in with handler threads and a userfaultfd
     * that serves them; in-thread, or where the userfaultfd is
     * user-mode-only (an ordinary user's), they get EFAULT. */
    struct upager_info info = {.size = sizeof info};
    CHECK(upager_info(pg, &info) == 0, "upager_info: %s", upager_last_error());
    CHECK(info.syscalls_fault_in ==
              (mode == UPAGER_FAULT_HANDLERS && !info.user_mode_only),
          "syscalls_fault_in %d in mode %d", info.syscalls_fault_in, mode);
    if (!info.syscalls_fault_in) {
        CHECK(w < 0 && errno == EFAULT,
              "mode %d: write from a non-resident range returned %zd (%s), "
              "expected EFAULT", mode, w, w < 0 ? strerror(errno) : "no error");
        expect(upager_fault_in(r, off, n, 2), EINVAL, "flags", "fault-in flags");
        expect(upager_fault_in(r, FILE_BYTES, 1, 0), EINVAL, "outside the region",
               "fault-in range");
        expect(upager_fault_in(r, off, n, UPAGER_FAULT_IN_WRITE), EOPNOTSUPP,
               "read-only", "fault-in for writing a read-only region");
        CHECK(upager_fault_in(r, off, n, 0) == 0, "fault_in: %s",
              upager_last_error());
        w = write(fd, base + off, n);
    }
    CHECK(w == (ssize_t)n, "write from region memory: %zd (%s)", w,
          w < 0 ? strerror(errno) : "short");
    close(fd);
    CHECK(upager_unmap(r, 0) == 0, "unmap: %s", upager_last_error());
    upager_destroy(pg);
    /* What write() took from the region is the file's pattern. */
    fd = open(out, O_RDONLY);
    uint64_t word;
    for (size_t k = 0; k < n / 8; k += 512) {
        CHECK(pread(fd, &word, 8, k * 8) == 8, "pread");
        CHECK(word == pattern(off / 8 + k), "word %zu written from the region",
              k);
    }
    close(fd);
}

int main(void) {
    char path[256], out[256];
    snprintf(path, sizeof path, "%s/upager-capi-mode-%d", scratch_dir(),
             (int)getpid());
    snprintf(out, sizeof out, "%s/upager-capi-mode-out-%d", scratch_dir(),
             (int)getpid());
    make_file(path, FILE_BYTES);

    /* Names, and the NULL handle. */
    CHECK(!strcmp(upager_fault_mode_name(UPAGER_FAULT_HANDLERS), "handlers"),
          "name of handlers");
    CHECK(!strcmp(upager_fault_mode_name(UPAGER_FAULT_IN_THREAD), "in-thread"),
          "name of in-thread");
    CHECK(upager_fault_mode_name(UPAGER_FAULT_FROM_ENV) == NULL, "from-env");
    CHECK(upager_fault_mode_name(2) == NULL, "no mode 2");
    expect(upager_fault_mode(NULL), EINVAL, "pager is NULL", "NULL pager");

    /* The defaults follow UPAGER_FAULT_MODE as the harness set it. */
    const char *env = getenv("UPAGER_FAULT_MODE");
    int want = mode_for(env);
    struct upager_options po;
    upager_options_init(&po);
    CHECK(po.fault_mode == want, "init under UPAGER_FAULT_MODE=%s: %d, "
          "expected %d", env ? env : "(unset)", po.fault_mode, want);
    upager_t *pg = NULL;
    if (want == UPAGER_FAULT_FROM_ENV && env && *env) {
        expect(upager_create(NULL, &pg), EINVAL, "UPAGER_FAULT_MODE",
               "bad UPAGER_FAULT_MODE in the environment");
    } else {
        CHECK(upager_create(NULL, &pg) == 0, "create(NULL): %s",
              upager_last_error());
        struct upager_info info = {.size = sizeof info};
        CHECK(upager_info(pg, &info) == 0, "upager_info: %s",
              upager_last_error());
        /* Unset: handlers where system calls can fault pages in, in-thread
         * where the userfaultfd is user-mode-only (an ordinary user's). */
        int chosen = want != UPAGER_FAULT_FROM_ENV ? want
                     : info.user_mode_only ? UPAGER_FAULT_IN_THREAD
                                           : UPAGER_FAULT_HANDLERS;
        CHECK(upager_fault_mode(pg) == chosen && info.fault_mode == chosen,
              "create(NULL) under UPAGER_FAULT_MODE=%s: mode %d, info %d",
              env ? env : "(unset)", upager_fault_mode(pg), info.fault_mode);
        CHECK(info.syscalls_fault_in ==
                  (chosen == UPAGER_FAULT_HANDLERS && !info.user_mode_only),
              "syscalls_fault_in %d", info.syscalls_fault_in);
        const char *um = getenv("UPAGER_USERFAULTFD");
        if (um && !strcmp(um, "user-mode-only"))
            CHECK(info.user_mode_only == 1, "UPAGER_USERFAULTFD=%s", um);
        info.size = 1;
        expect(upager_info(pg, &info), EINVAL, "upager_info.size", "bad size");
        expect(upager_info(pg, NULL), EINVAL, "NULL", "NULL info");
        upager_destroy(pg);
    }

    /* init reads the variable at each call (setenv: no pager thread reads
     * the environment). */
    const char *values[] = {"in-thread", "handlers", " In-Thread ", "",
                            "sigbus"};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        CHECK(setenv("UPAGER_FAULT_MODE", values[i], 1) == 0, "setenv");
        upager_options_init(&po);
        int m = strcmp(values[i], " In-Thread ") ? mode_for(values[i])
                                                  : UPAGER_FAULT_IN_THREAD;
        CHECK(po.fault_mode == m, "init under UPAGER_FAULT_MODE=\"%s\": %d, "
              "expected %d", values[i], po.fault_mode, m);
    }
    /* A bad value: init succeeds, creation fails naming the variable and
     * the choices; setting the field overrides the variable. */
    upager_options_init(&po);
    po.budget = BUDGET;
    pg = NULL;
    expect(upager_create(&po, &pg), EINVAL, "UPAGER_FAULT_MODE=\"sigbus\"",
           "bad variable");
    expect(upager_create(&po, &pg), EINVAL, "\"handlers\" or \"in-thread\"",
           "bad variable: the choices");
    CHECK(pg == NULL, "no pager on failure");
    po.fault_mode = UPAGER_FAULT_IN_THREAD;
    CHECK(upager_create(&po, &pg) == 0, "explicit mode over a bad variable: %s",
          upager_last_error());
    CHECK(upager_fault_mode(pg) == UPAGER_FAULT_IN_THREAD, "explicit mode");
    upager_destroy(pg);
    /* UPAGER_FAULT_FROM_ENV reads it when the pager is created. */
    setenv("UPAGER_FAULT_MODE", "in-thread", 1);
    pg = create(UPAGER_FAULT_IN_THREAD);
    upager_destroy(pg);
    po.fault_mode = UPAGER_FAULT_FROM_ENV;
    CHECK(upager_create(&po, &pg) == 0, "from env: %s", upager_last_error());
    CHECK(upager_fault_mode(pg) == UPAGER_FAULT_IN_THREAD, "from env");
    upager_destroy(pg);
    if (env) setenv("UPAGER_FAULT_MODE", env, 1);
    else unsetenv("UPAGER_FAULT_MODE");
    /* A value that is no mode. */
    upager_options_init(&po);
    po.fault_mode = 7;
    expect(upager_create(&po, &pg), EINVAL, "UPAGER_FAULT_IN_THREAD (1)",
           "fault_mode 7");

    /* Both modes at work, whatever the environment says. */
    int modes[] = {UPAGER_FAULT_HANDLERS, UPAGER_FAULT_IN_THREAD};
    for (int i = 0; i < 2; i++) {
        work_in(modes[i], path);
        syscall_on_region(modes[i], path, out);
        printf("fault_mode %s: ok\n", upager_fault_mode_name(modes[i]));
    }
    unlink(path);
    unlink(out);
    printf("fault_mode ok\n");
    return 0;
}
