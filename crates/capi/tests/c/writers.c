/* Several writers of one file: two pagers of one
 * process map the same file writable and write alternate words of the
 * same folios; after flushes in both orders the file holds both writers'
 * words (twins and diffs), and twins_made / diff_writebacks count them. */
#include "common.h" /* first: it sets _GNU_SOURCE */

#include <upager.h>

#define FILE_BYTES (2 * MIB)
#define WORDS (FILE_BYTES / 8)

static upager_region_t *map_rw(upager_t **pg, const char *path) {
    struct upager_options po;
    upager_options_init(&po);
    po.budget = 16 * MIB;
    CHECK(upager_create(&po, pg) == 0, "create: %s", upager_last_error());
    struct upager_map_options mo;
    upager_map_options_init(&mo);
    mo.flags = UPAGER_MAP_WRITE;
    upager_region_t *r = NULL;
    CHECK(upager_map_file(*pg, path, &mo, &r) == 0, "map: %s", upager_last_error());
    return r;
}

int main(void) {
    char path[] = "/dev/shm/upager-writers-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    make_file(path, FILE_BYTES);
    upager_t *pa = NULL, *pb = NULL;
    upager_region_t *ra = map_rw(&pa, path);
    upager_region_t *rb = map_rw(&pb, path);
    volatile uint64_t *a = upager_region_addr(ra);
    volatile uint64_t *b = upager_region_addr(rb);
    /* a: the even words of the first half; b: every odd word */
    for (uint64_t i = 0; i < WORDS / 2; i += 2) a[i] = ~pattern(i);
    for (uint64_t i = 1; i < WORDS; i += 2) b[i] = ~pattern(i);
    CHECK(upager_flush(rb) == 0, "flush b: %s", upager_last_error());
    CHECK(upager_flush(ra) == 0, "flush a: %s", upager_last_error());
    /* a: the even words of the second half, on folios b flushed since
     * a read them; a flushes first now */
    for (uint64_t i = WORDS / 2; i < WORDS; i += 2) a[i] = ~pattern(i);
    CHECK(upager_flush(ra) == 0, "flush a: %s", upager_last_error());
    CHECK(upager_flush(rb) == 0, "flush b: %s", upager_last_error());
    uint64_t *got = malloc(FILE_BYTES);
    CHECK(got, "malloc");
    fd = open(path, O_RDONLY);
    CHECK(fd >= 0 && pread(fd, got, FILE_BYTES, 0) == FILE_BYTES, "read back");
    close(fd);
    uint64_t wrong = 0;
    for (uint64_t i = 0; i < WORDS; i++) wrong += got[i] != ~pattern(i);
    CHECK(wrong == 0, "%" PRIu64 " of %u words lost", wrong, (unsigned)WORDS);
    uint64_t twins = 0, diffs = 0;
    CHECK(upager_stat(pa, "twins_made", &twins) == 0, "stat");
    CHECK(upager_stat(pa, "diff_writebacks", &diffs) == 0, "stat");
    CHECK(twins > 0 && diffs > 0, "twins_made %" PRIu64 ", diff_writebacks %" PRIu64, twins, diffs);
    free(got);
    CHECK(upager_unmap(ra, 0) == 0, "unmap a: %s", upager_last_error());
    CHECK(upager_unmap(rb, 0) == 0, "unmap b: %s", upager_last_error());
    upager_destroy(pa);
    upager_destroy(pb);
    unlink(path);
    printf("writers: %" PRIu64 " twins, %" PRIu64 " diff write-backs, nothing lost\n", twins, diffs);
    return 0;
}
