/* upager.h: threads read and write a file 8x the budget through a region,
 * flush, unmap, and the file is verified with plain reads; then a range of
 * it is mapped by descriptor with an offset, and anonymous memory 4x the
 * budget is written and read back through its swap file. */
#include "common.h" /* first: it sets _GNU_SOURCE */

#include <upager.h>


#define TRY(call)                                                          \
    do {                                                                   \
        int rc_ = (call);                                                  \
        CHECK(rc_ == 0, "%s = %d (%s): %s", #call, rc_,                    \
              upager_strerror(rc_), upager_last_error());                  \
    } while (0)

static uint64_t counter(const upager_t *p, const char *name) {
    uint64_t v = 0;
    TRY(upager_stat(p, name, &v));
    return v;
}

int main(void) {
    const uint64_t budget = 8 * MIB, size = 8 * budget;
    char path[256];
    snprintf(path, sizeof path, "%s/upager-capi-native-%d", scratch_dir(),
             (int)getpid());
    make_file(path, size);

    struct upager_options po;
    upager_options_init(&po);
    po.budget = budget;
    upager_t *pg = NULL;
    TRY(upager_create(&po, &pg));

    /* 1. Whole file, read-write, by path: 4 threads verify and write. */
    struct upager_map_options mo;
    upager_map_options_init(&mo);
    mo.flags = UPAGER_MAP_WRITE;
    upager_region_t *r = NULL;
    TRY(upager_map_file(pg, path, &mo, &r));
    CHECK(upager_region_length(r) == size, "length");
    CHECK(upager_region_writable(r) == 1, "writable");
    CHECK(upager_region_folio(r) == 4096, "default folio (4 KiB for files)");
    run_workers(upager_region_addr(r), 0, size / 8, 4, WRITE);
    TRY(upager_flush(r));
    CHECK(counter(pg, "resident_peak_bytes") <= budget, "peak %" PRIu64
          " above the budget", counter(pg, "resident_peak_bytes"));
    CHECK(counter(pg, "evictions") > 0, "no evictions over 8x the budget");
    CHECK(counter(pg, "writebacks") > 0, "no write-backs");
    CHECK(counter(pg, "flushes") == 1, "flushes");
    verify_file(path, size, 1); /* after flush, before unmap */
    TRY(upager_unmap(r, 0));
    CHECK(counter(pg, "resident_bytes") == 0, "unmap left %" PRIu64
          " bytes resident", counter(pg, "resident_bytes"));

    /* 2. A range by descriptor, with an offset, read-only, 4 KiB folios. */
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0, "open");
    upager_map_options_init(&mo);
    mo.offset = 24 * MIB;
    mo.length = 16 * MIB + 8; /* not a multiple of the folio */
    mo.folio = 4096;
    TRY(upager_map_fd(pg, fd, &mo, &r));
    close(fd); /* the region has its own descriptor */
    CHECK(upager_region_writable(r) == 0, "read-only");
    run_workers(upager_region_addr(r), mo.offset / 8, mo.length / 8, 3,
                READ_WRITTEN);
    TRY(upager_unmap(r, 0));

    /* 3. Anonymous memory, 4x the budget, through the private swap file. */
    TRY(upager_map_anonymous(pg, 4 * budget, NULL, &r));
    uint64_t *a = upager_region_addr(r), n = 4 * budget / 8;
    for (uint64_t i = 0; i < n; i += 512) CHECK(a[i] == 0, "not zero");
    for (uint64_t i = 0; i < n; i++) a[i] = pattern(i);
    for (uint64_t i = 0; i < n; i++)
        CHECK(a[i] == pattern(i), "anonymous word %" PRIu64, i);
    TRY(upager_unmap(r, 0));

    /* 4. Residency, pageout, prefetch, discard (64 KiB folios). */
    upager_map_options_init(&mo);
    mo.flags = UPAGER_MAP_WRITE;
    mo.length = 4 * MIB;
    mo.folio = 64 * 1024;
    TRY(upager_map_file(pg, path, &mo, &r));
    struct upager_extent ext[64];
    CHECK(upager_residency(r, 0, 4 * MIB, ext, 64) == 1 &&
          ext[0].state == UPAGER_NEVER_TOUCHED && ext[0].length == 4 * MIB,
          "fresh region not never-touched");
    volatile uint64_t *w = upager_region_addr(r);
    CHECK(w[0] == written(0), "word 0");
    w[2 * MIB / 8 + 1] = 42; /* one dirty folio at 2 MiB */
    /* The engine marks a folio resident just after the faulting access
     * resumes: wait until no run is busy before looking. */
    int busy = 1;
    for (int tries = 0; busy && tries < 5000; tries++) {
        if (tries) usleep(1000); /* the poll interval of a bounded wait */
        int k = upager_residency(r, 0, 4 * MIB, ext, 64);
        busy = 0;
        for (int i = 0; i < k && i < 64; i++)
            busy |= ext[i].state == UPAGER_BUSY;
    }
    CHECK(!busy, "a folio still busy after 5 s");
    unsigned char vec[1024];
    TRY(upager_mincore(r, 0, 4 * MIB, vec));
    CHECK(vec[0] == 1 && vec[2 * MIB / 4096] == 1, "mincore %d %d", vec[0],
          vec[2 * MIB / 4096]);
    int nrun = upager_residency(r, 2 * MIB, 64 * 1024, ext, 64);
    CHECK(nrun == 1 && ext[0].state == UPAGER_RESIDENT_DIRTY, "dirty run");
    int64_t out = upager_pageout(r, 0, 4 * MIB);
    CHECK(out >= 2, "pageout evicted %" PRId64, out);
    CHECK(upager_residency(r, 0, 4096, ext, 64) == 1 &&
          ext[0].state == UPAGER_EVICTED, "evicted marker");
    CHECK(counter(pg, "resident_bytes") == 0, "resident after pageout");
    {   /* pageout wrote the dirty folio back */
        int f = open(path, O_RDONLY);
        uint64_t v = 0;
        CHECK(pread(f, &v, 8, 2 * MIB + 8) == 8 && v == 42, "written back");
        close(f);
    }
    TRY(upager_prefetch(r, 0, 1 * MIB));
    TRY(upager_prefetch_wait(r, 10000));
    TRY(upager_mincore(r, 0, 1 * MIB, vec));
    for (int i = 0; i < 256; i++) CHECK(vec[i] == 1, "prefetched page %d", i);
    {   /* upager_fetch: scattered offsets read in batches, resident
         * folios skipped; UPAGER_FETCH_WRITE: writable and dirty, so the
         * writes fault no more, and they are written back. */
        CHECK(upager_pageout(r, 0, 4 * MIB) >= 0, "pageout before fetch");
        uint64_t offs[3] = {3 * MIB + 8, 1 * MIB + 70000, 3 * MIB + 16};
        CHECK(upager_fetch(r, offs, 3, 0) == 2, "fetch read two folios");
        CHECK(upager_fetch(r, offs, 3, 0) == 0, "resident folios skipped");
        uint64_t wo[2] = {2 * MIB + 512 * 1024, 2 * MIB + 640 * 1024};
        uint64_t wp = counter(pg, "faults_wp");
        uint64_t miss = counter(pg, "faults_missing");
        CHECK(upager_fetch(r, wo, 2, UPAGER_FETCH_WRITE) == 2,
              "fetch for write read two folios");
        w[wo[0] / 8] = 5;
        w[wo[1] / 8] = 6;
        CHECK(counter(pg, "faults_wp") == wp &&
              counter(pg, "faults_missing") == miss,
              "the writes after a fetch for write faulted");
        uint64_t bad = 4 * MIB;
        CHECK(upager_fetch(r, &bad, 1, 0) == -EINVAL, "offset past the end");
        CHECK(upager_fetch(r, offs, 3, 2) == -EINVAL, "unknown flag");
        CHECK(upager_fetch(r, NULL, 1, 0) == -EINVAL, "NULL offsets");
        CHECK(upager_fetch(r, NULL, 0, 0) == 0, "no offsets");
        TRY(upager_flush(r));
        int f = open(path, O_RDONLY);
        uint64_t v[2] = {0, 0};
        CHECK(pread(f, &v[0], 8, (off_t)wo[0]) == 8 &&
              pread(f, &v[1], 8, (off_t)wo[1]) == 8 && v[0] == 5 && v[1] == 6,
              "fetched-for-write words written back");
        close(f);
    }
    CHECK(upager_pageout(r, 1000, 4096) == -EINVAL, "unaligned pageout");
    CHECK(upager_residency(r, 0, 8 * MIB, ext, 64) == -EINVAL, "out of range");
    TRY(upager_unmap(r, 0));
    TRY(upager_map_anonymous(pg, 1 * MIB, NULL, &r));
    w = upager_region_addr(r);
    w[0] = 7;
    TRY(upager_discard(r, 0, 1 * MIB));
    CHECK(w[0] == 0, "discarded anonymous memory reads zero");
    TRY(upager_unmap(r, 0));

    /* Counters: names, bulk read, the same values by name. */
    size_t count = upager_stat_count();
    CHECK(count >= 20, "counters");
    CHECK(strcmp(upager_stat_name(0), "faults_missing") == 0, "first name");
    CHECK(upager_stat_name(count) == NULL, "past the end");
    uint64_t vals[128];
    CHECK(upager_stats(pg, vals, 128) == (int)count, "upager_stats");
    for (size_t i = 0; i < count; i++) {
        const char *nm = upager_stat_name(i);
        if (strstr(nm, "resident") || strstr(nm, "budget")) continue;
        CHECK(counter(pg, nm) == vals[i], "counter %s", nm);
    }
    CHECK(counter(pg, "budget_bytes") == budget, "budget_bytes");
    CHECK(counter(pg, "resident_peak_bytes") <= budget, "peak");
    printf("native_rw: ok (file %" PRIu64 " MiB, budget %" PRIu64
           " MiB, peak %" PRIu64 " KiB, %" PRIu64 " evictions in %" PRIu64
           " batches, %" PRIu64 " TLB flush calls, %" PRIu64
           " write-backs)\n", size / MIB, budget / MIB,
           counter(pg, "resident_peak_bytes") / 1024, counter(pg, "evictions"),
           counter(pg, "evict_batches"), counter(pg, "tlb_flush_batches"),
           counter(pg, "writebacks"));
    upager_destroy(pg);
    unlink(path);
    return 0;
}
