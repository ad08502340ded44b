/* An object of an S3-compatible store from C: with opts.store =
 * "s3://BUCKET/KEY", upager_map_file(pager, NULL, opts) maps the object
 * read-only under a budget a quarter of its size (every word right); a
 * writable map is -EROFS, an anonymous region swapping to an object
 * -EINVAL (it swaps to a bucket or prefix: then every word written four
 * budgets' worth reads back), a missing object -ENOENT, each with a
 * message.
 *   store_s3 s3://BUCKET/KEY BYTES   (an object of BYTES bytes of pattern();
 *   credentials and endpoint from AWS_* as the AWS SDKs read them)
 * Run by python/tests/test_s3.py, which owns the server and the object. */
#include "common.h"
#include <upager.h>

static void check_rc(int rc, int want, const char *what) {
    CHECK(rc == want, "%s returned %d (%s), expected %d: %s", what, rc,
          upager_strerror(rc), want, upager_last_error());
}

int main(int argc, char **argv) {
    CHECK(argc == 3, "usage: store_s3 s3://BUCKET/KEY BYTES");
    const char *url = argv[1];
    uint64_t len = strtoull(argv[2], NULL, 10);
    CHECK(len >= MIB && len % 8 == 0, "BYTES: %s", argv[2]);

    struct upager_options po;
    upager_options_init(&po);
    po.budget = len / 4;
    upager_t *pg;
    check_rc(upager_create(&po, &pg), 0, "upager_create");

    struct upager_map_options mo;
    upager_map_options_init(&mo);
    mo.store = url;
    upager_region_t *r;
    check_rc(upager_map_file(pg, NULL, &mo, &r), 0, "upager_map_file(s3)");
    CHECK(upager_region_length(r) == len, "length %" PRIu64, upager_region_length(r));
    const uint64_t *w = upager_region_addr(r);
    for (uint64_t i = 0; i < len / 8; i++)
        CHECK(w[i] == pattern(i), "word %" PRIu64 ": %" PRIx64, i, w[i]);
    uint64_t faults = 0, peak = 0;
    check_rc(upager_region_stat(r, "faults_missing", &faults), 0, "faults_missing");
    CHECK(faults > 0, "no faults");
    uint64_t gets = 0, received = 0;
    check_rc(upager_region_stat(r, "store_gets", &gets), 0, "store_gets");
    check_rc(upager_region_stat(r, "store_bytes_received", &received), 0, "store_bytes_received");
    CHECK(gets > 0 && received >= len, "store counters: %" PRIu64 " GETs, %" PRIu64 " bytes",
          gets, received);
    check_rc(upager_stat(pg, "resident_peak_bytes", &peak), 0, "resident_peak_bytes");
    CHECK(peak <= len / 4, "peak %" PRIu64 " over the budget", peak);
    check_rc(upager_unmap(r, 0), 0, "upager_unmap");

    /* Writable: refused, with the reason. */
    mo.flags = UPAGER_MAP_WRITE;
    check_rc(upager_map_file(pg, NULL, &mo, &r), -EROFS, "writable map");
    CHECK(strstr(upager_last_error(), "read-only") != NULL, "%s",
          upager_last_error());
    mo.flags = 0;
    check_rc(upager_map_anonymous(pg, MIB, &mo, &r), -EINVAL, "anonymous on an object");
    CHECK(strstr(upager_last_error(), "prefix") != NULL, "%s",
          upager_last_error());

    /* Anonymous memory swapping to the bucket's prefix swap/ (far memory):
     * four budgets' worth written, every word back. */
    char prefix[600];
    const char *slash = strchr(url + strlen("s3://"), '/');
    CHECK(slash != NULL, "no key in %s", url);
    snprintf(prefix, sizeof prefix, "%.*sswap/", (int)(slash + 1 - url), url);
    mo.store = prefix;
    uint64_t alen = len;
    check_rc(upager_map_anonymous(pg, alen, &mo, &r), 0, "anonymous on s3 swap");
    uint64_t *a = upager_region_addr(r);
    for (uint64_t i = 0; i < alen / 8; i += 512)
        a[i] = pattern(i) ^ 0x5a5a;
    for (uint64_t i = 0; i < alen / 8; i += 512)
        CHECK(a[i] == (pattern(i) ^ 0x5a5a), "swapped word %" PRIu64, i);
    uint64_t evicted = 0;
    check_rc(upager_stat(pg, "evictions", &evicted), 0, "evictions");
    CHECK(evicted > 0, "nothing was swapped out");
    check_rc(upager_unmap(r, 0), 0, "upager_unmap(anonymous)");
    mo.store = url;

    /* No such object. */
    char missing[600];
    snprintf(missing, sizeof missing, "%s-no-such-object", url);
    mo.store = missing;
    check_rc(upager_map_file(pg, NULL, &mo, &r), -ENOENT, "missing object");

    upager_destroy(pg);
    printf("store_s3: ok (%" PRIu64 " bytes read under a %" PRIu64
           "-byte budget)\n", len, len / 4);
    return 0;
}
