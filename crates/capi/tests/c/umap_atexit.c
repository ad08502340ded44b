/* umap/umap.h: regions still mapped at exit() are flushed (UMap-style
 * programs often end without uunmap). A child process writes through
 * umap() and returns from main; the parent checks the file. */
#include "common.h" /* first: it sets _GNU_SOURCE */

#include <sys/wait.h>
#include <umap/umap.h>

int main(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/upager-capi-atexit-%d", scratch_dir(),
             (int)getpid());
    const uint64_t size = 4 * MIB;
    make_file(path, size);
    pid_t pid = fork(); /* before any umap call: the child makes its pager */
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        int fd = open(path, O_RDWR);
        uint64_t *p = umap(NULL, size, PROT_READ | PROT_WRITE, UMAP_PRIVATE,
                           fd, 0);
        if (p == UMAP_FAILED) _exit(2);
        for (uint64_t i = 0; i < size / 8; i++)
            if (i % 8 == 0) p[i] = ~p[i];
        return 0; /* exit() without umap_flush or uunmap */
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed");
    verify_file(path, size, 1);
    unlink(path);
    printf("umap_atexit: ok\n");
    return 0;
}
