/* umap/umap.h: a program written for UMap. Threads read and write a file
 * 8x the buffer (UMAP_BUFSIZE pages, set by the harness), umap_flush,
 * uunmap, and the file is verified with plain reads; umap honours offset;
 * prefetch and fetch_and_pin; the getters report the environment.
 * Usage: umap_rw FILE_MIB THREADS */
#include "common.h" /* first: it sets _GNU_SOURCE */

#include <umap/umap.h>
#include <upager.h> /* only for the counters and messages */


static uint64_t counter(const char *name) {
    uint64_t v = 0;
    int rc = upager_umap_stat(name, &v);
    CHECK(rc == 0, "upager_umap_stat(%s) = %d: %s", name, rc,
          upager_last_error());
    return v;
}

int main(int argc, char **argv) {
    uint64_t size = (argc > 1 ? strtoull(argv[1], NULL, 0) : 64) * MIB;
    int nthreads = argc > 2 ? atoi(argv[2]) : 4;
    uint64_t psize = umapcfg_get_umap_page_size();
    uint64_t budget = umapcfg_get_max_pages_in_buffer() * psize;
    const char *e = getenv("UMAP_BUFSIZE");
    CHECK(e && strtoull(e, NULL, 0) == umapcfg_get_max_pages_in_buffer(),
          "UMAP_BUFSIZE not reported");
    e = getenv("UMAP_PAGE_FILLERS");
    CHECK(!e || strtoull(e, NULL, 0) == umapcfg_get_num_fillers(), "fillers");
    CHECK(umapcfg_get_evict_high_water_threshold() >=
          umapcfg_get_evict_low_water_threshold(), "thresholds");
    CHECK(umapcfg_get_system_page_size() == sysconf(_SC_PAGESIZE), "psz");
    CHECK(umap_has_write_support() == 1, "write support");
    (void)umapcfg_get_max_fault_events();
    (void)umapcfg_get_num_evictors();
    (void)umapcfg_get_read_ahead();

    char path[256];
    snprintf(path, sizeof path, "%s/upager-capi-umap-%d", scratch_dir(),
             (int)getpid());
    make_file(path, size);
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0, "open");

    /* The UMap way: map the whole file read-write, work, flush, unmap. */
    char *base = umap(NULL, size, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
    CHECK(base != UMAP_FAILED, "umap: %s: %s", strerror(errno),
          upager_last_error());
    CHECK((uintptr_t)base % psize == 0, "alignment");
    struct umap_prefetch_item items[4];
    for (int i = 0; i < 4; i++) items[i].page_base_addr = base + i * psize;
    umap_prefetch(4, items);
    run_workers(base, 0, size / 8, nthreads, WRITE);
    CHECK(umap_flush() == 0, "umap_flush: %s", strerror(errno));
    verify_file(path, size, 1);
    umap_fetch_and_pin(base, 2 * psize);
    CHECK(counter("pinned_bytes") == 2 * psize, "fetch_and_pin pinned %" PRIu64
          " bytes", counter("pinned_bytes"));
    CHECK(uunmap(base, size) == 0, "uunmap: %s", strerror(errno));
    CHECK(counter("pinned_bytes") == 0, "uunmap left pins");
    uint64_t peak = counter("resident_peak_bytes");
    CHECK(peak <= budget, "peak %" PRIu64 " above the budget %" PRIu64,
          peak, budget);
    CHECK(counter("resident_bytes") == 0, "uunmap left memory resident");
    CHECK(counter("evictions") > 0, "no evictions");

    /* offset is honoured (UMap ignores it), read-only. */
    uint64_t off = size / 2, len = size / 4;
    uint64_t *q = umap(NULL, len, PROT_READ, UMAP_PRIVATE, fd, off);
    CHECK(q != UMAP_FAILED, "umap offset: %s", upager_last_error());
    close(fd); /* umap keeps its own descriptor */
    for (uint64_t k = 0; k < len / 8; k += 97)
        CHECK(q[k] == written(off / 8 + k), "offset word %" PRIu64, k);
    CHECK(uunmap(q, len) == 0, "uunmap 2");

    /* UMAP_FIXED: the two halves of the file side by side in one
       reservation of ours (umapsort -N 2 does this). */
    fd = open(path, O_RDWR);
    CHECK(fd >= 0, "reopen");
    char *res = mmap(NULL, size + psize, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(res != MAP_FAILED, "reserve");
    char *at = (char *)(((uintptr_t)res + psize - 1) / psize * psize);
    uint64_t half = size / 2;
    uint64_t *h0 = umap(at, half, PROT_READ | PROT_WRITE,
                        UMAP_PRIVATE | UMAP_FIXED, fd, 0);
    CHECK((char *)h0 == at, "UMAP_FIXED 1: %p %s", (void *)h0,
          upager_last_error());
    CHECK(umap(at + psize / 2, half, PROT_READ, UMAP_PRIVATE | UMAP_FIXED, fd,
               0) == UMAP_FAILED && errno == EINVAL,
          "an unaligned UMAP_FIXED is refused");
    uint64_t *h1 = umap(at + half, half, PROT_READ, UMAP_PRIVATE | UMAP_FIXED,
                        fd, half);
    CHECK((char *)h1 == at + half, "UMAP_FIXED 2: %s", upager_last_error());
    for (uint64_t k = 0; k < size / 8; k += 61)
        CHECK(((uint64_t *)at)[k] == written(k), "fixed word %" PRIu64, k);
    h0[3] = written(3);
    CHECK(uunmap(h0, half) == 0 && uunmap(h1, half) == 0, "uunmap fixed");
    close(fd);

    printf("umap_rw: ok (file %" PRIu64 " MiB, %d threads, buffer %" PRIu64
           " pages of %" PRIu64 " bytes, peak %" PRIu64 " KiB, %" PRIu64
           " evictions in %" PRIu64 " batches)\n", size / MIB, nthreads,
           umapcfg_get_max_pages_in_buffer(), psize, peak / 1024,
           counter("evictions"), counter("evict_batches"));
    unlink(path);
    return 0;
}
