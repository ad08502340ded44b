// A UMap C++ program with its own Umap::Store subclass: an
// in-memory store counting its calls, mapped with Umap::umap_ex under a
// buffer of 1/8 of the region (UMAP_BUFSIZE from the harness). Every word
// reads right, every write reaches the store (after uunmap the store holds
// it), the store sees reads and writes, and a second umap_ex reads the data
// back from it. (Failing, short and blocking stores: store_ops.c, through
// the same C callbacks.)
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <umap/umap.h>
#include <umap/store/Store.hpp>

#include "common.hpp"

static uint64_t pattern(uint64_t i) { return (i + 1) * 0x9E3779B97F4A7C15ull; }

class MemoryStore : public Umap::Store {
public:
    explicit MemoryStore(size_t bytes) : words(bytes / 8) {
        for (size_t i = 0; i < words.size(); i++) words[i] = pattern(i);
    }
    ssize_t read_from_store(char *buf, std::size_t nb, off_t off) override {
        reads++;
        if ((size_t)off + nb > words.size() * 8) nb = words.size() * 8 - off;
        std::memcpy(buf, reinterpret_cast<char *>(words.data()) + off, nb);
        return (ssize_t)nb;
    }
    ssize_t write_to_store(char *buf, std::size_t nb, off_t off) override {
        writes++;
        CHECK((size_t)off + nb <= words.size() * 8, "write past the end");
        std::memcpy(reinterpret_cast<char *>(words.data()) + off, buf, nb);
        return (ssize_t)nb;
    }
    std::vector<uint64_t> words;
    std::atomic<uint64_t> reads{0}, writes{0};
};

int main() {
    const size_t len = 8u << 20;
    uint64_t page = umapcfg_get_umap_page_size();
    uint64_t buffer = umapcfg_get_max_pages_in_buffer() * page;
    CHECK(buffer * 4 <= len, "UMAP_BUFSIZE too large for this test: %" PRIu64,
          buffer);
    MemoryStore store(len);
    void *base = Umap::umap_ex(nullptr, len, PROT_READ | PROT_WRITE,
                               UMAP_PRIVATE, -1, 0, &store);
    CHECK(base != UMAP_FAILED, "umap_ex: %s", std::strerror(errno));
    volatile uint64_t *w = static_cast<volatile uint64_t *>(base);
    for (size_t i = 0; i < len / 8; i++)
        CHECK(w[i] == pattern(i), "word %zu", i);
    for (size_t i = 0; i < len / 8; i += 8) w[i] = ~pattern(i);
    // Evicted pages were written back on the way; the rest at uunmap.
    CHECK(uunmap(base, len) == 0, "uunmap: %s", std::strerror(errno));
    for (size_t i = 0; i < len / 8; i++) {
        uint64_t want = i % 8 == 0 ? ~pattern(i) : pattern(i);
        CHECK(store.words[i] == want, "store word %zu is %#" PRIx64, i,
              store.words[i]);
    }
    CHECK(store.reads >= len / page / 64, "only %" PRIu64 " reads",
          store.reads.load());
    CHECK(store.writes > 0, "no writes");
    // Mapped again: the data comes back from the store.
    base = Umap::umap_ex(nullptr, len, PROT_READ, UMAP_PRIVATE, -1, 0, &store);
    CHECK(base != UMAP_FAILED, "umap_ex again: %s", std::strerror(errno));
    w = static_cast<volatile uint64_t *>(base);
    for (size_t i = 0; i < len / 8; i += 7) {
        uint64_t want = i % 8 == 0 ? ~pattern(i) : pattern(i);
        CHECK(w[i] == want, "word %zu after remap", i);
    }
    CHECK(uunmap(base, len) == 0, "uunmap");
    std::printf("umap_store: ok (%" PRIu64 " reads, %" PRIu64
                " writes reached the store; buffer %" PRIu64 " KiB)\n",
                store.reads.load(), store.writes.load(), buffer >> 10);
    return 0;
}
