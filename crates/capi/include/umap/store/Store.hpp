/*
 * umap/store/Store.hpp - LLNL UMap's abstract store, served by upager.
 *
 * Subclass Umap::Store to page a region from storage of your own and map it
 * with Umap::umap_ex() (<umap/umap.h>). Same class as UMap's: the two pure
 * virtual methods below, and Store::make_store() for a store over a file
 * descriptor. upager adds a virtual destructor (delete through a Store* is
 * then safe) and gives predict_offsets() (pure in later UMap versions) a
 * default; neither changes what a UMap subclass must write.
 *
 * Header-only: it forwards to upager's C callbacks (struct upager_store_ops
 * in <upager.h>), so nothing here needs linking beyond -lumap.
 */
#ifndef _UMAP_STORE_H_
#define _UMAP_STORE_H_

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <unistd.h>

namespace Umap {

class Store {
public:
    virtual ~Store() {}

    /* A store over the open descriptor fd (pread/pwrite at the region's
     * offsets): what umap() does with a descriptor. The other arguments
     * are UMap's and not needed here. Delete it after uunmap(). */
    static Store *make_store(void *_region_, std::size_t _rsize_,
                             std::size_t _alignsize_, int _fd_);

    /* Read up to nb bytes at store offset off into buf: bytes read, or -1
     * with errno. Called on upager's threads, several at once. */
    virtual ssize_t read_from_store(char *buf, std::size_t nb, off_t off) = 0;
    /* Write nb bytes of buf at off: bytes written (a short write is
     * continued), or -1 with errno. */
    virtual ssize_t write_to_store(char *buf, std::size_t nb, off_t off) = 0;

    /* Later UMap versions ask stores for offsets to prefetch; upager does
     * its own readahead and never calls it. */
    virtual int predict_offsets(off_t *offsets, off_t off) {
        (void)offsets;
        (void)off;
        return 0;
    }
};

namespace detail {

/* Store::make_store(): pread/pwrite on a descriptor. */
class DescriptorStore : public Store {
public:
    explicit DescriptorStore(int fd) : fd_(fd) {}
    ssize_t read_from_store(char *buf, std::size_t nb, off_t off) override {
        return ::pread(fd_, buf, nb, off);
    }
    ssize_t write_to_store(char *buf, std::size_t nb, off_t off) override {
        return ::pwrite(fd_, buf, nb, off);
    }

private:
    int fd_;
};

/* The callbacks of struct upager_store_ops over a Store: errors and
 * exceptions become negative errnos (nothing may unwind into upager). */
inline int64_t store_read(void *ctx, void *buf, std::size_t len,
                          uint64_t off) noexcept {
    try {
        errno = 0;
        ssize_t r = static_cast<Store *>(ctx)->read_from_store(
            static_cast<char *>(buf), len, (off_t)off);
        if (r < 0)
            return -(errno ? errno : EIO);
        return r;
    } catch (...) {
        return -EIO;
    }
}

inline int store_write(void *ctx, const void *buf, std::size_t len,
                       uint64_t off) noexcept {
    try {
        Store *s = static_cast<Store *>(ctx);
        std::size_t done = 0;
        while (done < len) {
            errno = 0;
            ssize_t w = s->write_to_store(
                const_cast<char *>(static_cast<const char *>(buf)) + done,
                len - done, (off_t)(off + done));
            if (w <= 0)
                return -(w < 0 && errno ? errno : EIO);
            done += (std::size_t)w;
        }
        return 0;
    } catch (...) {
        return -EIO;
    }
}

} /* namespace detail */

inline Store *Store::make_store(void *_region_, std::size_t _rsize_,
                                std::size_t _alignsize_, int _fd_) {
    (void)_region_;
    (void)_rsize_;
    (void)_alignsize_;
    return new detail::DescriptorStore(_fd_);
}

} /* namespace Umap */

#endif /* _UMAP_STORE_H_ */
