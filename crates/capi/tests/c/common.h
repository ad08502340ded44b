/* Shared helpers of the C tests: a pattern file on /dev/shm, checks. */
#ifndef UPAGER_TEST_COMMON_H
#define UPAGER_TEST_COMMON_H

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB (1024u * 1024u)

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__,         \
                    __LINE__, #cond);                                      \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

/* Word i of the test file (64-bit words). */
static inline uint64_t pattern(uint64_t i) {
    return (i + 1) * 0x9E3779B97F4A7C15ull;
}
/* The next number of a xorshift64 sequence in *x (never 0 from non-0). */
static inline uint64_t xorshift64(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}
/* Reads one word in each of `touch` scattered 4 KiB pages of the
 * `pages`-page pattern file mapped at `w`, in a fixed order (the same every
 * call: a gather with a fixed index set), 20 us apart (a program's work),
 * checking each. */
static inline void read_scattered(volatile const uint64_t *w, uint64_t pages, int touch) {
    uint64_t x = 88172645463325252ull;
    for (int k = 0; k < touch; k++) {
        uint64_t word = (xorshift64(&x) % pages) * 512;
        CHECK(w[word] == pattern(word), "word %" PRIu64, word);
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}
/* Word i after the tests' write pass: every 8th word (one per 64 bytes,
 * so every page gets dirty) is inverted. */
static inline uint64_t written(uint64_t i) {
    return i % 8 == 0 ? ~pattern(i) : pattern(i);
}

/* Creates `path` with `bytes` bytes of pattern(). */
static inline void make_file(const char *path, uint64_t bytes) {
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
    size_t chunk = 1 * MIB;
    uint64_t *buf = malloc(chunk);
    for (uint64_t off = 0; off < bytes; off += chunk) {
        size_t n = bytes - off < chunk ? bytes - off : chunk;
        for (size_t w = 0; w < n / 8; w++) buf[w] = pattern(off / 8 + w);
        CHECK(pwrite(fd, buf, n, off) == (ssize_t)n, "pwrite");
    }
    free(buf);
    close(fd);
}

/* Verifies the file with plain reads: words [0, bytes/8) hold
 * written(i) if `after_write`, pattern(i) otherwise. */
static inline void verify_file(const char *path, uint64_t bytes,
                               int after_write) {
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0, "open %s", path);
    size_t chunk = 1 * MIB;
    uint64_t *buf = malloc(chunk);
    for (uint64_t off = 0; off < bytes; off += chunk) {
        size_t n = bytes - off < chunk ? bytes - off : chunk;
        CHECK(pread(fd, buf, n, off) == (ssize_t)n, "pread");
        for (size_t w = 0; w < n / 8; w++) {
            uint64_t i = off / 8 + w;
            uint64_t want = after_write ? written(i) : pattern(i);
            CHECK(buf[w] == want, "file word %" PRIu64 " is %#" PRIx64
                  ", expected %#" PRIx64, i, buf[w], want);
        }
    }
    free(buf);
    close(fd);
}

/* A worker over a mapped region: thread `t` of `nthreads` owns the 1 MiB
 * chunks c with c % nthreads == t. mode WRITE: pass 0 verifies pattern()
 * and writes, pass 1 verifies written(); mode READ_PATTERN / READ_WRITTEN:
 * one pass verifying pattern() / written(). */
enum mode { WRITE, READ_PATTERN, READ_WRITTEN };
struct work {
    volatile uint64_t *base; /* word 0 of the region = file word `first` */
    uint64_t first, words;
    int t, nthreads;
    enum mode mode;
    uint64_t checked;
};

static inline void *worker(void *arg) {
    struct work *w = arg;
    uint64_t per_chunk = MIB / 8;
    int write = w->mode == WRITE;
    for (int pass = 0; pass < (write ? 2 : 1); pass++) {
        for (uint64_t c = w->t; c * per_chunk < w->words; c += w->nthreads) {
            uint64_t end = (c + 1) * per_chunk;
            if (end > w->words) end = w->words;
            for (uint64_t k = c * per_chunk; k < end; k++) {
                uint64_t i = w->first + k;
                uint64_t want = (pass == 0 && w->mode != READ_WRITTEN) ? pattern(i)
                                                               : written(i);
                uint64_t got = w->base[k];
                CHECK(got == want, "thread %d pass %d word %" PRIu64
                      ": %#" PRIx64 " != %#" PRIx64, w->t, pass, i, got, want);
                if (pass == 0 && write && i % 8 == 0) w->base[k] = ~got;
                w->checked++;
            }
        }
    }
    return NULL;
}

/* Runs `nthreads` workers over the region and joins them. */
static inline void run_workers(void *base, uint64_t first_word,
                               uint64_t words, int nthreads, enum mode mode) {
    pthread_t th[16];
    struct work w[16];
    CHECK(nthreads <= 16, "too many threads");
    for (int t = 0; t < nthreads; t++) {
        w[t] = (struct work){.base = base, .first = first_word,
                             .words = words, .t = t, .nthreads = nthreads,
                             .mode = mode};
        CHECK(pthread_create(&th[t], NULL, worker, &w[t]) == 0, "spawn");
    }
    for (int t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
}

static inline const char *scratch_dir(void) {
    const char *d = getenv("UPAGER_TEST_DIR");
    return d ? d : "/dev/shm";
}

#endif
