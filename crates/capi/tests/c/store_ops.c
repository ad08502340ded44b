/* A store of the program's own (struct upager_store_ops): an
 * in-memory store with counters, mapped under a budget 1/4 of its size.
 *   - every word reads right through short reads (at most 3000 bytes per
 *     call), and every write reaches the store (after upager_flush, the
 *     store's own memory holds it; sync was called);
 *   - a store whose read fails: the access gets SIGBUS, the other pages
 *     still read right;
 *   - a store whose reads block (50 ms each) does not stop faults on
 *     another region;
 *   - release is called once, at unmap; a read-only store refuses
 *     UPAGER_MAP_WRITE; bad structs are EINVAL.
 * Runs in both fault modes (the harness sets UPAGER_FAULT_MODE). */
#include "common.h"

#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <upager.h>

struct mem_store {
    uint64_t *words;
    uint64_t length;
    size_t max_read;       /* short reads: at most this many bytes */
    uint64_t fail_from;    /* reads at or past this offset fail (EIO) */
    unsigned delay_ms;     /* each read sleeps this long */
    atomic_ulong reads, writes, syncs, releases, bytes_written;
};

static int64_t ms_read(void *ctx, void *buf, size_t len, uint64_t off) {
    struct mem_store *s = ctx;
    atomic_fetch_add(&s->reads, 1);
    if (s->delay_ms) {
        struct timespec ts = {0, (long)s->delay_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (off + len > s->fail_from) return -EIO;
    if (len > s->max_read) len = s->max_read;
    memcpy(buf, (char *)s->words + off, len);
    return (int64_t)len;
}

static int ms_write(void *ctx, const void *buf, size_t len, uint64_t off) {
    struct mem_store *s = ctx;
    atomic_fetch_add(&s->writes, 1);
    atomic_fetch_add(&s->bytes_written, len);
    CHECK(off + len <= s->length, "write past the end: %" PRIu64, off + len);
    memcpy((char *)s->words + off, buf, len);
    return 0;
}

static int ms_sync(void *ctx) {
    atomic_fetch_add(&((struct mem_store *)ctx)->syncs, 1);
    return 0;
}

static void ms_release(void *ctx) {
    atomic_fetch_add(&((struct mem_store *)ctx)->releases, 1);
}

static void ms_init(struct mem_store *s, uint64_t length) {
    memset(s, 0, sizeof *s);
    s->words = malloc(length);
    CHECK(s->words != NULL, "malloc");
    s->length = length;
    s->max_read = (size_t)-1;
    s->fail_from = UINT64_MAX;
    for (uint64_t i = 0; i < length / 8; i++) s->words[i] = pattern(i);
}

static struct upager_store_ops ms_ops(struct mem_store *s, int writable) {
    struct upager_store_ops ops;
    upager_store_ops_init(&ops);
    ops.ctx = s;
    ops.length = s->length;
    ops.read = ms_read;
    if (writable) ops.write = ms_write;
    ops.sync = ms_sync;
    ops.release = ms_release;
    return ops;
}

static upager_region_t *map(upager_t *pg, struct upager_store_ops *ops,
                            uint32_t flags, uint64_t folio) {
    struct upager_map_options mo;
    upager_map_options_init(&mo);
    mo.flags = flags;
    mo.folio = folio;
    upager_region_t *r = NULL;
    int rc = upager_map_store(pg, ops, &mo, &r);
    CHECK(rc == 0, "upager_map_store: %d %s", rc, upager_last_error());
    return r;
}

static sigjmp_buf jump;
static volatile void *bus_addr;
static void on_bus(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)uc;
    bus_addr = si->si_addr;
    siglongjmp(jump, 1);
}

struct reader {
    volatile uint64_t *words;
    uint64_t n;
    atomic_int done;
};
static void *read_blocked(void *arg) {
    struct reader *r = arg;
    uint64_t sum = 0;
    for (uint64_t i = 0; i < r->n; i += 512) sum += r->words[i];
    (void)sum;
    atomic_store(&r->done, 1);
    return NULL;
}

int main(void) {
    /* Our SIGBUS handler first: in the in-thread mode upager passes the
     * SIGBUS of a failed read on to the handler installed before it. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_bus;
    sa.sa_flags = SA_SIGINFO;
    CHECK(sigaction(SIGBUS, &sa, NULL) == 0, "sigaction");

    const uint64_t len = 16 * MIB;
    struct upager_options po;
    upager_options_init(&po);
    po.budget = len / 4;
    upager_t *pg;
    CHECK(upager_create(&po, &pg) == 0, "upager_create: %s", upager_last_error());

    /* 1. Short reads, writes, flush, release. */
    struct mem_store s;
    ms_init(&s, len);
    s.max_read = 3000;
    struct upager_store_ops ops = ms_ops(&s, 1);
    upager_region_t *r = map(pg, &ops, UPAGER_MAP_WRITE, 0);
    volatile uint64_t *w = upager_region_addr(r);
    for (uint64_t i = 0; i < len / 8; i++)
        CHECK(w[i] == pattern(i), "word %" PRIu64 " reads %#" PRIx64, i, w[i]);
    for (uint64_t i = 0; i < len / 8; i += 8) w[i] = ~pattern(i);
    CHECK(upager_flush(r) == 0, "flush: %s", upager_last_error());
    for (uint64_t i = 0; i < len / 8; i++)
        CHECK(s.words[i] == written(i), "store word %" PRIu64 " is %#" PRIx64
              " after flush", i, s.words[i]);
    CHECK(atomic_load(&s.syncs) >= 1, "flush did not call sync");
    CHECK(atomic_load(&s.bytes_written) >= len, "only %lu bytes written",
          atomic_load(&s.bytes_written));
    CHECK(atomic_load(&s.releases) == 0, "released while mapped");
    CHECK(upager_unmap(r, 0) == 0, "unmap: %s", upager_last_error());
    CHECK(atomic_load(&s.releases) == 1, "release called %lu times",
          atomic_load(&s.releases));
    printf("store_ops: short reads ok (%lu reads, %lu writes, %lu syncs)\n",
           atomic_load(&s.reads), atomic_load(&s.writes), atomic_load(&s.syncs));

    /* 2. A read that fails: SIGBUS for that access, the rest reads. */
    struct mem_store f;
    ms_init(&f, len);
    f.fail_from = len / 2;
    struct upager_store_ops fops = ms_ops(&f, 0);
    upager_region_t *fr = map(pg, &fops, 0, 4096);
    volatile uint64_t *fw = upager_region_addr(fr);
    CHECK(fw[0] == pattern(0), "first word");
    int bus = 0;
    if (sigsetjmp(jump, 1) == 0) {
        uint64_t v = fw[len / 16 + 5];
        (void)v;
    } else {
        bus = 1;
    }
    CHECK(bus, "a failed store read did not raise SIGBUS");
    CHECK(((uintptr_t)bus_addr & ~(uintptr_t)4095) ==
              ((uintptr_t)(fw + len / 16) & ~(uintptr_t)4095),
          "SIGBUS at %p, expected the page at %p", (void *)bus_addr,
          (void *)(fw + len / 16));
    /* Backwards, so no readahead run reaches into the failing half (a
     * run's read is one store read: it fails as a whole). */
    for (uint64_t i = len / 16; i-- > 0;)
        if (i % 512 == 0)
            CHECK(fw[i] == pattern(i), "word %" PRIu64 " after the SIGBUS", i);
    CHECK(upager_unmap(fr, 0) == 0, "unmap: %s", upager_last_error());

    /* 3. A store that blocks: faults on another region go on meanwhile. */
    struct mem_store slow, fast;
    ms_init(&slow, 4 * MIB);
    ms_init(&fast, 4 * MIB);
    slow.delay_ms = 50;
    struct upager_store_ops sops = ms_ops(&slow, 0), qops = ms_ops(&fast, 0);
    upager_region_t *sr = map(pg, &sops, 0, 4096);
    upager_region_t *qr = map(pg, &qops, 0, 4096);
    struct reader rd = {upager_region_addr(sr), 4 * MIB / 8, 0};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, read_blocked, &rd) == 0, "spawn");
    volatile uint64_t *qw = upager_region_addr(qr);
    for (uint64_t i = 0; i < 4 * MIB / 8; i += 512)
        CHECK(qw[i] == pattern(i), "fast word %" PRIu64, i);
    CHECK(!atomic_load(&rd.done),
          "the slow region was read before the fast one (it should take "
          "about 50 ms per read)");
    pthread_join(th, NULL);
    CHECK(upager_unmap(sr, 0) == 0 && upager_unmap(qr, 0) == 0, "unmap");

    /* 4. Refusals. */
    struct mem_store ro;
    ms_init(&ro, MIB);
    struct upager_store_ops rops = ms_ops(&ro, 0);
    struct upager_map_options mo;
    upager_map_options_init(&mo);
    mo.flags = UPAGER_MAP_WRITE;
    upager_region_t *x = NULL;
    int rc = upager_map_store(pg, &rops, &mo, &x);
    CHECK(rc < 0 && x == NULL, "a read-only store mapped writable: %d", rc);
    CHECK(atomic_load(&ro.releases) == 1, "release after a failed map: %lu",
          atomic_load(&ro.releases));
    rops.read = NULL;
    CHECK(upager_map_store(pg, &rops, NULL, &x) == -EINVAL &&
              strstr(upager_last_error(), "read is NULL"),
          "NULL read: %s", upager_last_error());
    rops = ms_ops(&ro, 0);
    rops.size = 8;
    CHECK(upager_map_store(pg, &rops, NULL, &x) == -EINVAL, "bad size");
    CHECK(upager_map_store(pg, NULL, NULL, &x) == -EINVAL, "NULL ops");

    upager_destroy(pg);
    printf("store_ops: ok (failed read -> SIGBUS at the page, slow store "
           "blocks only its own faults, refusals)\n");
    return 0;
}
