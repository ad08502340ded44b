// Umap::SparseStore: a region of 8 MiB over a directory of
// 1 MiB files, buffer 1/8 of it (UMAP_BUFSIZE from the harness). Writing
// only the first and the sixth MiB creates exactly files 0 and 5 (the
// store is sparse: files appear where pages were written); after uunmap
// a new SparseStore in open mode and a new umap_ex read the same data;
// the directory, the metadata and the capacity follow UMap's layout.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <sys/stat.h>

#include <umap/umap.h>
#include <umap/store/SparseStore.h>

#include "common.hpp"

static uint64_t value(uint64_t i) { return (i + 3) * 0xD1B54A32D192ED03ull; }

static bool exists(const std::string &p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0;
}

int main() {
    const char *tmp = std::getenv("UPAGER_TEST_DIR");
    std::string dir = std::string(tmp ? tmp : "/dev/shm") + "/upager-sparse-" +
                      std::to_string(::getpid());
    const size_t len = 8u << 20, file = 1u << 20;
    const size_t page = umapcfg_get_umap_page_size();
    {
        Umap::SparseStore store(len, page, dir, file);
        CHECK(store.get_current_capacity() == len, "capacity %zu",
              store.get_current_capacity());
        void *base = Umap::umap_ex(nullptr, len, PROT_READ | PROT_WRITE,
                                   UMAP_PRIVATE, -1, 0, &store);
        CHECK(base != UMAP_FAILED, "umap_ex: %s", std::strerror(errno));
        volatile uint64_t *w = static_cast<volatile uint64_t *>(base);
        for (size_t i = 0; i < file / 8; i++) w[i] = value(i);
        for (size_t i = 5 * file / 8; i < 6 * file / 8; i++) w[i] = value(i);
        CHECK(uunmap(base, len) == 0, "uunmap: %s", std::strerror(errno));
        CHECK(store.close_files() == 0, "close_files");
    }
    for (int f = 0; f < 8; f++) {
        bool want = f == 0 || f == 5;
        CHECK(exists(dir + "/" + std::to_string(f)) == want,
              "file %d %s", f, want ? "missing" : "created but never written");
    }
    CHECK(exists(dir + "/_metadata"), "no _metadata");
    CHECK(Umap::SparseStore::get_capacity(dir) == len, "get_capacity");
    bool threw = false;
    try {
        Umap::SparseStore again(len, page, dir, file);
    } catch (const std::runtime_error &e) {
        threw = std::strstr(e.what(), "already exists") != nullptr;
    }
    CHECK(threw, "create mode over an existing directory did not say so");
    {
        Umap::SparseStore store(dir, false);
        void *base = Umap::umap_ex(nullptr, len, PROT_READ, UMAP_PRIVATE, -1,
                                   0, &store);
        CHECK(base != UMAP_FAILED, "umap_ex (open mode): %s",
              std::strerror(errno));
        volatile uint64_t *w = static_cast<volatile uint64_t *>(base);
        for (size_t i = 0; i < len / 8; i++) {
            bool written = i < file / 8 || (i >= 5 * file / 8 && i < 6 * file / 8);
            uint64_t want = written ? value(i) : 0;
            CHECK(w[i] == want, "word %zu is %#" PRIx64 " after reopening", i,
                  w[i]);
        }
        CHECK(uunmap(base, len) == 0, "uunmap");
    }
    std::string rm = "rm -rf '" + dir + "'";
    CHECK(std::system(rm.c_str()) == 0, "rm");
    std::printf("umap_sparsestore: ok (files 0 and 5 of 8 created, data back "
                "after reopening)\n");
    return 0;
}
