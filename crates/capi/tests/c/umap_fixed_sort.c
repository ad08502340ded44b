/* umapsort's multi-file mode through umap/umap.h, as umapsort
 * does it: umap a 64 MiB base file to get the address range, then map two
 * 32 MiB files of random 64-bit keys with UMAP_FIXED side by side over it
 * (each replaces the regions in its range, as MAP_FIXED does: the base
 * region is written back and unmapped), sort the 64 MiB as one array with
 * qsort under a buffer of 1/4 of it (UMAP_BUFSIZE from the harness),
 * flush, unmap; the files then hold the sorted keys, none lost (same sum
 * and xor), the first file's keys all <= the second's; the word written
 * to the base region before it was replaced reached the base file; a
 * fixed range that is not page-aligned is refused; a thread mapping and
 * unmapping buffers all the while (as malloc does, and the engine's own
 * threads) never gets one inside the range: the replaced region's range
 * stays reserved, never a hole that UMAP_FIXED would then map over (CI
 * saw a fill's read buffer land there and fail with EFAULT). */
#include "common.h"

#include <stdatomic.h>
#include <sys/mman.h>
#include <umap/umap.h>

static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void make_keys(const char *path, uint64_t bytes, uint64_t seed,
                      uint64_t *sum, uint64_t *xr) {
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
    CHECK(fd >= 0, "open %s", path);
    uint64_t *buf = malloc(MIB), x = seed;
    for (uint64_t off = 0; off < bytes; off += MIB) {
        for (size_t i = 0; i < MIB / 8; i++) {
            buf[i] = xorshift64(&x);
            *sum += x, *xr ^= x;
        }
        CHECK(pwrite(fd, buf, MIB, off) == (ssize_t)MIB, "pwrite");
    }
    free(buf);
    close(fd);
}

/* The range UMAP_FIXED replaces, and the buffers mapped inside it (8 MiB,
 * as a thread's stack: a hole left by the replaced region is then the
 * first gap that fits; measured with a hole: 3 of 30 runs had some). */
#define BUF_BYTES (8 * MIB)
static uintptr_t range_lo, range_hi;
static atomic_int stop_mapping;
static long landed, mapped;

static void *map_buffers(void *arg) {
    (void)arg;
    while (!stop_mapping) {
        char *p = mmap(NULL, BUF_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            continue;
        p[0] = 1;
        mapped++;
        if ((uintptr_t)p < range_hi && (uintptr_t)p + BUF_BYTES > range_lo)
            landed++;
        munmap(p, BUF_BYTES);
    }
    return NULL;
}

int main(void) {
    const uint64_t half = 32 * MIB;
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/upager-sort-a-%d", scratch_dir(), getpid());
    snprintf(b, sizeof b, "%s/upager-sort-b-%d", scratch_dir(), getpid());
    uint64_t sum = 0, xr = 0;
    make_keys(a, half, 0x1234567, &sum, &xr);
    make_keys(b, half, 0x89abcdef, &sum, &xr);
    uint64_t budget = umapcfg_get_max_pages_in_buffer() * umapcfg_get_umap_page_size();
    CHECK(budget * 4 <= 2 * half, "UMAP_BUFSIZE too large for this test");

    /* The range, as umapsort gets it: a umap of its base file. */
    char basepath[256];
    snprintf(basepath, sizeof basepath, "%s/upager-sort-base-%d", scratch_dir(), getpid());
    make_file(basepath, 2 * half);
    int fbase = open(basepath, O_RDWR);
    CHECK(fbase >= 0, "open base");
    char *base = umap(NULL, 2 * half, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fbase, 0);
    CHECK(base != UMAP_FAILED, "umap base: %s", strerror(errno));
    ((volatile uint64_t *)base)[12345] = 0xB0B0;
    range_lo = (uintptr_t)base, range_hi = (uintptr_t)base + 2 * half;
    pthread_t mapper;
    CHECK(pthread_create(&mapper, NULL, map_buffers, NULL) == 0, "thread");
    int fa = open(a, O_RDWR), fb = open(b, O_RDWR);
    CHECK(fa >= 0 && fb >= 0, "open");
    CHECK(umap(base + 4096 + 8, half, PROT_READ, UMAP_PRIVATE | UMAP_FIXED, fa, 0) ==
              UMAP_FAILED && errno == EINVAL, "an unaligned fixed address was accepted");
    void *ra = umap(base, half, PROT_READ | PROT_WRITE, UMAP_PRIVATE | UMAP_FIXED, fa, 0);
    void *rb = umap(base + half, half, PROT_READ | PROT_WRITE, UMAP_PRIVATE | UMAP_FIXED, fb, 0);
    CHECK(ra == base && rb == base + half, "fixed maps at %p: %p %p (%s)",
          (void *)base, ra, rb, strerror(errno));
    stop_mapping = 1;
    pthread_join(mapper, NULL);
    CHECK(landed == 0, "%ld of %ld buffers mapped meanwhile landed in the replaced range",
          landed, mapped);
    /* The base region was written back when it was replaced. */
    uint64_t word = 0;
    CHECK(pread(fbase, &word, 8, 12345 * 8) == 8 && word == 0xB0B0,
          "the base region's write was lost: %#" PRIx64, word);
    close(fbase);
    unlink(basepath);

    qsort(base, 2 * half / 8, 8, cmp);
    CHECK(umap_flush() == 0, "umap_flush: %s", strerror(errno));
    CHECK(uunmap(ra, half) == 0 && uunmap(rb, half) == 0, "uunmap");
    close(fa);
    close(fb);

    /* The files, read with plain I/O. */
    uint64_t prev = 0, s2 = 0, x2 = 0;
    const char *paths[2] = {a, b};
    uint64_t *buf = malloc(MIB);
    for (int f = 0; f < 2; f++) {
        int fd = open(paths[f], O_RDONLY);
        CHECK(fd >= 0, "open %s", paths[f]);
        for (uint64_t off = 0; off < half; off += MIB) {
            CHECK(pread(fd, buf, MIB, off) == (ssize_t)MIB, "pread");
            for (size_t i = 0; i < MIB / 8; i++) {
                CHECK(buf[i] >= prev, "not sorted at file %d word %" PRIu64, f,
                      off / 8 + i);
                prev = buf[i];
                s2 += buf[i], x2 ^= buf[i];
            }
        }
        close(fd);
        unlink(paths[f]);
    }
    free(buf);
    CHECK(s2 == sum && x2 == xr, "keys lost or changed by the sort");
    printf("umap_fixed_sort: ok (2 x 32 MiB at fixed addresses in one "
           "reservation, sorted under a %" PRIu64 " MiB buffer; %ld buffers "
           "mapped beside the replacement, none in its range)\n", budget / MIB, mapped);
    return 0;
}
