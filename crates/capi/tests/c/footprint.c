/* The engine's own memory: starting it (the first umap() of a
 * 64 KiB file) adds at most 4 MiB of resident memory; after a 64 MiB scan
 * through a 16 MiB buffer, once idle, what the process holds beyond the
 * resident folios shrinks back under 4 MiB (the fill buffers a readahead
 * run grew are given back: before, 5.3-7.6 MiB stayed); and the counter
 * overhead_bytes accounts for it (between half and twice the measured
 * figure, under 4 MiB). Runs in both fault modes. */
#include "common.h"

#include <time.h>
#include <umap/umap.h>
#include <upager.h>

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f != NULL, "/proc/self/status");
    char line[256];
    long v = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) v = atol(line + 6);
    fclose(f);
    return v;
}

static uint64_t stat_of(const char *name) {
    uint64_t v = 0;
    CHECK(upager_umap_stat(name, &v) == 0, "stat %s", name);
    return v;
}

static char path[256];
static int make(uint64_t bytes, const char *tag) {
    snprintf(path, sizeof path, "%s/upager-fp-%s-%d", scratch_dir(), tag, getpid());
    make_file(path, bytes);
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0, "open");
    unlink(path);
    return fd;
}

int main(void) {
    int small = make(64 << 10, "small"), big = make(64 * MIB, "big");
    long before = rss_kib();
    volatile uint64_t *s = umap(NULL, 64 << 10, PROT_READ, UMAP_PRIVATE, small, 0);
    CHECK(s != UMAP_FAILED, "umap: %s", strerror(errno));
    CHECK(s[1] == pattern(1), "small file");
    long started = rss_kib() - before;
    CHECK(started <= 4096, "starting the engine added %ld KiB", started);

    uint64_t budget = umapcfg_get_max_pages_in_buffer() * umapcfg_get_umap_page_size();
    CHECK(budget <= 16 * MIB, "UMAP_BUFSIZE too large for this test");
    volatile uint64_t *b = umap(NULL, 64 * MIB, PROT_READ, UMAP_PRIVATE, big, 0);
    CHECK(b != UMAP_FAILED, "umap: %s", strerror(errno));
    for (uint64_t i = 0; i < 64 * MIB / 8; i += 512)
        CHECK(b[i] == pattern(i), "word %" PRIu64, i);
    /* Idle: handler threads shrink their buffers as they go idle, the
     * reclaimer the SIGBUS handlers' after 50 ms without work. */
    long engine = 0, counted = 0;
    for (int tries = 0; tries < 60; tries++) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        engine = rss_kib() - before - (long)(stat_of("resident_bytes") >> 10);
        counted = (long)(stat_of("overhead_bytes") >> 10);
        if (engine <= 4096 && counted <= 4096) break;
    }
    printf("footprint: engine start +%ld KiB; after a 64 MiB scan, idle: %ld KiB "
           "besides folios, overhead_bytes %ld KiB\n", started, engine, counted);
    CHECK(engine <= 4096, "the engine holds %ld KiB besides folios after 3 s idle",
          engine);
    CHECK(counted >= engine / 2 && counted <= 2 * engine + 1024 && counted <= 4096,
          "overhead_bytes %ld KiB against %ld KiB measured", counted, engine);
    CHECK(uunmap((void *)b, 64 * MIB) == 0 && uunmap((void *)s, 64 << 10) == 0,
          "uunmap");
    return 0;
}
