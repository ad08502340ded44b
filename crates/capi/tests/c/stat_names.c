/* The counter names and their order are ABI: a C program may index
 * upager_stats() values by position. The list below is written out, not
 * read from the library, so a rename, removal or reorder fails here; the
 * same list is pinned for Rust (crates/upager/tests/engine.rs, Stats::NAMES)
 * and Python (python/tests/test_upager.py, upager.STAT_NAMES). A new
 * counter goes at the end of all three. */
#include "common.h" /* first: it sets _GNU_SOURCE */

#include <upager.h>

static const char *const names[] = {
    "faults_missing",
    "faults_wp",
    "faults_deferred",
    "faults_stale",
    "faults_failed",
    "fills",
    "fills_readahead",
    "bytes_read",
    "bytes_written",
    "evictions",
    "evict_batches",
    "evict_direct",
    "evict_background",
    "evict_pageout",
    "reclaim_scanned",
    "writebacks",
    "writeback_errors",
    "read_errors",
    "tlb_flush_batches",
    "wp_unprotects",
    "direct_reclaim_stalls",
    "refaults",
    "refaults_activated",
    "deactivations",
    "flushes",
    "resident_bytes",
    "resident_peak_bytes",
    "budget_bytes",
    "discards",
    "reclaim_lock_acquisitions",
    "evicted_markers",
    "dirty_bytes",
    "dirty_throttled",
    "writes_refused",
    "faults_in_thread",
    "faults_handed_off",
    "pinned_bytes",
    "writeback_submits",
    "thp_fills",
    "thp_fill_fallback",
    "thp_evictions",
    "overhead_bytes",
    "thp_recycled",
    "thp_fill_raced",
    "writes_lost",
    "kernel_call_errors",
    "writebacks_aged",
    "faults_slow",
    "twins_made",
    "diff_writebacks",
    "writer_switches",
    "readahead_async",
    "replay_reads",
    "replay_hits",
    "replay_wasted",
    "ztier_stores",
    "ztier_loads",
    "ztier_rejects",
    "ztier_writebacks",
    "ztier_folios",
    "ztier_bytes",
    "ztier_pool_bytes",
    "ztier_saved_bytes",
    "ztier_compress_ns",
    "ztier_decompress_ns",
};
#define NNAMES (sizeof names / sizeof names[0])

int main(void) {
    size_t n = upager_stat_count();
    CHECK(n == NNAMES, "upager_stat_count() is %zu, the pinned list has %zu",
          n, NNAMES);
    for (size_t i = 0; i < NNAMES; i++) {
        const char *got = upager_stat_name(i);
        CHECK(got && strcmp(got, names[i]) == 0,
              "counter %zu is named %s, expected %s", i, got ? got : "(NULL)",
              names[i]);
    }
    CHECK(upager_stat_name(NNAMES) == NULL, "a name past the end");

    /* upager_stats() fills values in that order: each value is the one
     * looked up by name (an idle pager with no region: nothing moves), and
     * the budget is the one given. */
    struct upager_options po;
    upager_options_init(&po);
    po.budget = 8 * MIB;
    upager_t *pg = NULL;
    int rc = upager_create(&po, &pg);
    CHECK(rc == 0, "upager_create: %s", upager_last_error());
    uint64_t values[NNAMES + 4];
    CHECK(upager_stats(pg, values, NNAMES + 4) == (int)NNAMES,
          "upager_stats count");
    for (size_t i = 0; i < NNAMES; i++) {
        uint64_t v = 0;
        CHECK(upager_stat(pg, names[i], &v) == 0, "upager_stat(%s): %s",
              names[i], upager_last_error());
        CHECK(values[i] == v, "values[%zu] is %" PRIu64 ", %s is %" PRIu64, i,
              values[i], names[i], v);
        if (strcmp(names[i], "budget_bytes") == 0)
            CHECK(v == 8 * MIB, "budget_bytes %" PRIu64, v);
    }
    upager_destroy(pg);
    printf("stat names: %zu counters in the pinned order\n", n);
    return 0;
}
