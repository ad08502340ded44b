/* Error cases of both headers: negative errno / UMAP_FAILED + errno, and a
 * message that says what is wrong. */
#include "common.h" /* first: it sets _GNU_SOURCE */

#include <umap/umap.h>
#include <upager.h>


/* rc must be -err and the last message must contain `text`. */
static void expect(int rc, int err, const char *text, const char *what) {
    CHECK(rc == -err, "%s: got %d (%s), expected -%d (%s); message: %s",
          what, rc, upager_strerror(rc), err, upager_strerror(err),
          upager_last_error());
    CHECK(strstr(upager_last_error(), text), "%s: message %s lacks %s",
          what, upager_last_error(), text);
}

int main(void) {
    char path[256], ro[256];
    snprintf(path, sizeof path, "%s/upager-capi-err-%d", scratch_dir(),
             (int)getpid());
    snprintf(ro, sizeof ro, "%s/upager-capi-err-ro-%d", scratch_dir(),
             (int)getpid());
    make_file(path, 1 * MIB);
    make_file(ro, 1 * MIB);
    chmod(ro, 0400);

    CHECK(strcmp(upager_strerror(-ENOENT), "No such file or directory") == 0,
          "strerror: %s", upager_strerror(-ENOENT));
    CHECK(upager_strerror(ENOENT) == upager_strerror(-ENOENT), "static");
    CHECK(strlen(upager_version()) > 0, "version");

    /* Pager options. */
    struct upager_options po;
    upager_options_init(&po);
    upager_t *pg = NULL;
    po.budget = 100;
    expect(upager_create(&po, &pg), EINVAL, "at least one folio", "budget");
    upager_options_init(&po);
    po.swap_dir = "/nonexistent/upager-swap";
    expect(upager_create(&po, &pg), EINVAL, "not a directory", "swap_dir");
    upager_options_init(&po);
    po.size = 8;
    expect(upager_create(&po, &pg), EINVAL, "upager_options_init", "size");
    upager_options_init(&po);
    po.handler_threads = 1000;
    expect(upager_create(&po, &pg), EINVAL, "1 to 64", "threads");
    upager_options_init(&po);
    po.direct_io = 7;
    expect(upager_create(&po, &pg), EINVAL, "direct_io", "tri-state");
    expect(upager_create(NULL, NULL), EINVAL, "output pointer", "NULL out");
    upager_options_init(&po);
    po.budget = 8 * MIB;
    CHECK(upager_create(&po, &pg) == 0, "create: %s", upager_last_error());

    /* Mapping. */
    upager_region_t *r = NULL;
    expect(upager_map_file(pg, "/nonexistent/upager", NULL, &r), ENOENT,
           "no such file", "missing file");
    expect(upager_map_file(pg, NULL, NULL, &r), EINVAL, "path is NULL",
           "NULL path");
    /* Issue 20 item 6: not a regular file, refused at map time (not a
       SIGBUS at the first access). */
    expect(upager_map_file(pg, "/tmp", NULL, &r), EISDIR,
           "/tmp is a directory, which upager cannot page", "directory");
    CHECK(strstr(upager_last_error(), "pass the path of a file inside it"),
          "directory advice: %s", upager_last_error());
    expect(upager_map_file(pg, "/dev/zero", NULL, &r), ENODEV,
           "is a character device", "character device");
    expect(upager_map_file(pg, "/proc/self/status", NULL, &r), ENODEV,
           "pseudo-file", "/proc file");
    {   /* A FIFO: refused without opening it (that would wait for a
           writer). */
        char fifo[300];
        snprintf(fifo, sizeof fifo, "%s.fifo", path);
        CHECK(mkfifo(fifo, 0600) == 0, "mkfifo: %s", strerror(errno));
        expect(upager_map_file(pg, fifo, NULL, &r), ENODEV, "is a FIFO",
               "FIFO");
        unlink(fifo);
        int dfd = open("/tmp", O_RDONLY | O_DIRECTORY);
        CHECK(dfd >= 0, "open /tmp");
        expect(upager_map_fd(pg, dfd, NULL, &r), EISDIR, "is a directory",
               "directory fd");
        close(dfd);
    }
    expect(upager_map_file(NULL, path, NULL, &r), EINVAL, "pager is NULL",
           "NULL pager");
    struct upager_map_options mo;
    upager_map_options_init(&mo);
    mo.folio = 3000;
    expect(upager_map_file(pg, path, &mo, &r), EINVAL, "power of two",
           "folio");
    upager_map_options_init(&mo);
    mo.folio = 64 << 10;
    mo.offset = 4096;
    expect(upager_map_file(pg, path, &mo, &r), EINVAL, "multiple of the folio",
           "offset");
    upager_map_options_init(&mo);
    mo.length = 2 * MIB;
    expect(upager_map_file(pg, path, &mo, &r), EINVAL, "beyond the end",
           "length");
    upager_map_options_init(&mo);
    mo.flags = 0x80;
    expect(upager_map_file(pg, path, &mo, &r), EINVAL, "unknown map flags",
           "flags");
    {   /* 1 MiB is below a batch of 64 folios of 64 KiB (the default
           batch shrinks to fit; a chosen one is checked) */
        upager_t *small = NULL;
        upager_options_init(&po);
        po.budget = 1 * MIB;
        po.batch = 64;
        CHECK(upager_create(&po, &small) == 0, "small pager");
        upager_map_options_init(&mo);
        mo.folio = 64 << 10;
        expect(upager_map_file(small, path, &mo, &r), EINVAL,
               "eviction batch", "budget below batch");
        upager_destroy(small);
        upager_options_init(&po);
        po.budget = 1 * MIB;
        po.dirty_limit = 2 * MIB;
        small = NULL;
        expect(upager_create(&po, &small), EINVAL, "dirty limit",
               "dirty limit above the budget");
        po.dirty_limit = MIB / 2;
        CHECK(upager_create(&po, &small) == 0, "a dirty limit of half the budget");
        upager_destroy(small);
    }
    expect(upager_map_fd(pg, -1, NULL, &r), EBADF, "not open", "bad fd");
    int fd = open(path, O_RDONLY);
    upager_map_options_init(&mo);
    mo.flags = UPAGER_MAP_WRITE;
    expect(upager_map_fd(pg, fd, &mo, &r), EACCES, "open it O_RDWR",
           "read-only fd mapped writable");
    if (geteuid() != 0) /* root may write anyway */
        expect(upager_map_file(pg, ro, &mo, &r), EACCES, "read-only",
               "read-only file mapped writable");
    expect(upager_map_anonymous(pg, 0, NULL, &r), EINVAL, "size is 0",
           "anonymous 0");
    upager_map_options_init(&mo);
    mo.offset = 65536;
    expect(upager_map_anonymous(pg, MIB, &mo, &r), EINVAL, "no file offset",
           "anonymous with an offset");
    expect(upager_flush(NULL), EINVAL, "region is NULL", "flush NULL");
    CHECK(upager_unmap(NULL, 0) == 0, "unmap NULL");

    /* A good region after the failures; counters by name. */
    CHECK(upager_map_fd(pg, fd, NULL, &r) == 0, "map_fd: %s",
          upager_last_error());
    close(fd);
    uint64_t v;
    expect(upager_stat(pg, "no_such_counter", &v), ENOENT, "evictions",
           "unknown counter");
    expect(upager_unmap(r, 0x10), EINVAL, "unknown unmap flags", "flags");
    CHECK(upager_region_stat(r, "budget_bytes", &v) == 0 && v == 8 * MIB,
          "region stat");
    struct upager_extent ext[4];
    expect(upager_residency(r, 100, 4096, ext, 4), EINVAL,
           "not a multiple of 4096 bytes, the alignment this call needs",
           "residency at an unaligned start");
    CHECK(upager_unmap(r, 0) == 0, "unmap");
    upager_destroy(pg);
    upager_destroy(NULL);

    /* The UMap face. */
    fd = open(path, O_RDWR);
    errno = 0;
    CHECK(umap(NULL, MIB, PROT_READ, MAP_SHARED, fd, 0) == UMAP_FAILED &&
          errno == EINVAL, "MAP_SHARED refused (errno %d)", errno);
    CHECK(umap(NULL, MIB, PROT_READ, UMAP_PRIVATE | UMAP_FIXED, fd, 0) ==
          UMAP_FAILED && errno == EINVAL, "UMAP_FIXED at NULL (errno %d)", errno);
    CHECK(strstr(upager_last_error(), "UMAP_FIXED"), "message");
    CHECK(umap(NULL, MIB, PROT_READ | PROT_EXEC, UMAP_PRIVATE, fd, 0) ==
          UMAP_FAILED && errno == EINVAL, "PROT_EXEC");
    CHECK(umap(NULL, 0, PROT_READ, UMAP_PRIVATE, fd, 0) == UMAP_FAILED &&
          errno == EINVAL, "length 0");
    CHECK(umap(NULL, MIB, PROT_READ, UMAP_PRIVATE, fd, -4096) == UMAP_FAILED
          && errno == EINVAL, "negative offset");
    CHECK(umap(NULL, 2 * MIB, PROT_READ, UMAP_PRIVATE, fd, 0) == UMAP_FAILED
          && errno == EINVAL, "beyond the end of the file");
    CHECK(umap(NULL, MIB, PROT_READ, UMAP_PRIVATE, 12345, 0) == UMAP_FAILED &&
          errno == EBADF, "bad fd (errno %d)", errno);
    int rofd = open(path, O_RDONLY);
    CHECK(umap(NULL, MIB, PROT_READ | PROT_WRITE, UMAP_PRIVATE, rofd, 0) ==
          UMAP_FAILED && errno == EACCES, "writable map of O_RDONLY fd");
    close(rofd);
    int dirfd = open("/tmp", O_RDONLY | O_DIRECTORY);
    errno = 0;
    CHECK(umap(NULL, 4096, PROT_READ, UMAP_PRIVATE, dirfd, 0) == UMAP_FAILED
          && errno == EISDIR, "umap of a directory (errno %d: %s)", errno,
          upager_last_error());
    CHECK(strstr(upager_last_error(), "is a directory"), "umap dir message: %s",
          upager_last_error());
    close(dirfd);
    int x;
    CHECK(uunmap(&x, 4096) == -1 && errno == EINVAL, "uunmap of a stranger");
    char *p = umap(NULL, MIB, PROT_READ, UMAP_PRIVATE, fd, 0);
    CHECK(p != UMAP_FAILED, "umap: %s", upager_last_error());
    CHECK(uunmap(p, 2 * MIB) == -1 && errno == EINVAL, "uunmap too long");
    CHECK(uunmap(p, MIB) == 0, "uunmap");
    CHECK(uunmap(p, MIB) == -1 && errno == EINVAL, "uunmap twice");
    close(fd);

    unlink(path);
    unlink(ro);
    printf("errors: ok\n");
    return 0;
}
