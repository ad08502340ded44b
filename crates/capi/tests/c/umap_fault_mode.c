/* umap/umap.h honours UPAGER_FAULT_MODE, so an unmodified UMap
 * program can run in either fault mode: the pager behind umap() takes the
 * mode the variable names (handlers if unset), its faults are counted
 * where that mode takes them, and a value that names no mode makes umap()
 * fail with EINVAL and a message naming the variable and the choices.
 * The harness runs it with the variable unset, "in-thread", "handlers"
 * and a bad value.
 * Usage: umap_fault_mode */
#include "common.h" /* first: it sets _GNU_SOURCE */

#include <umap/umap.h>
#include <upager.h> /* the mode, the counters and messages */

static uint64_t counter(const char *name) {
    uint64_t v = 0;
    int rc = upager_umap_stat(name, &v);
    CHECK(rc == 0, "upager_umap_stat(%s) = %d: %s", name, rc,
          upager_last_error());
    return v;
}

int main(void) {
    const char *env = getenv("UPAGER_FAULT_MODE");
    int want = UPAGER_FAULT_FROM_ENV; /* no mode */
    if (!env || !*env) want = -2; /* upager chooses: checked below */
    else if (!strcmp(env, "handlers")) want = UPAGER_FAULT_HANDLERS;
    else if (!strcmp(env, "in-thread")) want = UPAGER_FAULT_IN_THREAD;
    const char *shown = env ? env : "(unset)";

    uint64_t size = 16 * MIB;
    char path[256];
    snprintf(path, sizeof path, "%s/upager-capi-umap-mode-%d", scratch_dir(),
             (int)getpid());
    make_file(path, size);
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0, "open");

    if (want == UPAGER_FAULT_FROM_ENV) {
        errno = 0;
        void *p = umap(NULL, size, PROT_READ, UMAP_PRIVATE, fd, 0);
        CHECK(p == UMAP_FAILED && errno == EINVAL,
              "umap under UPAGER_FAULT_MODE=%s: %p, errno %d", shown, p, errno);
        /* (The message is valid until the next failing call: copy it.) */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", upager_last_error());
        CHECK(strstr(msg, "UPAGER_FAULT_MODE") &&
                  strstr(msg, "\"handlers\" or \"in-thread\""),
              "message \"%s\" names neither the variable nor the choices", msg);
        int rc = upager_umap_fault_mode();
        CHECK(rc == -EINVAL, "upager_umap_fault_mode: %d", rc);
        CHECK(strstr(upager_last_error(), "UPAGER_FAULT_MODE"),
              "upager_umap_fault_mode: message \"%s\"", upager_last_error());
        close(fd);
        unlink(path);
        printf("umap under UPAGER_FAULT_MODE=%s: EINVAL (%s)\n", shown, msg);
        return 0;
    }

    int mode = upager_umap_fault_mode();
    struct upager_info info = {.size = sizeof info};
    CHECK(upager_umap_info(&info) == 0, "upager_umap_info: %s",
          upager_last_error());
    CHECK(info.fault_mode == mode, "info %d, mode %d", info.fault_mode, mode);
    /* Unset: handlers, or in-thread with a user-mode-only userfaultfd (an
     * ordinary user's). */
    if (want == -2)
        want = info.user_mode_only ? UPAGER_FAULT_IN_THREAD : UPAGER_FAULT_HANDLERS;
    CHECK(mode == want, "umap pager under UPAGER_FAULT_MODE=%s: mode %d (%s), "
          "expected %d", shown, mode, upager_last_error(), want);
    /* A file 4x the buffer, read and written by 2 threads. */
    uint64_t budget = umapcfg_get_max_pages_in_buffer() *
                      umapcfg_get_umap_page_size();
    CHECK(budget * 4 <= size, "UMAP_BUFSIZE too large for this test");
    char *base = umap(NULL, size, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
    CHECK(base != UMAP_FAILED, "umap: %s: %s", strerror(errno),
          upager_last_error());
    run_workers(base, 0, size / 8, 2, WRITE);
    CHECK(uunmap(base, size) == 0, "uunmap: %s", strerror(errno));
    verify_file(path, size, 1);
    uint64_t in_thread = counter("faults_in_thread");
    uint64_t missing = counter("faults_missing");
    CHECK(missing > 0, "no faults");
    if (want == UPAGER_FAULT_IN_THREAD)
        CHECK(in_thread > 0, "in-thread: no in-thread faults of %" PRIu64,
              missing);
    else
        CHECK(in_thread == 0, "handlers: %" PRIu64 " in-thread faults",
              in_thread);
    CHECK(counter("resident_peak_bytes") <= budget, "budget exceeded");
    close(fd);
    unlink(path);
    printf("umap under UPAGER_FAULT_MODE=%s: %s, %" PRIu64 " faults (%" PRIu64
           " in-thread)\n", shown, upager_fault_mode_name(mode), missing,
           in_thread);
    return 0;
}
