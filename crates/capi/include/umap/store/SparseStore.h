/*
 * umap/store/SparseStore.h - LLNL UMap's SparseStore, served by upager.
 *
 * A store kept as a directory of fixed-size files, each created (and
 * allocated) the first time a page in it is written or read: a region can be
 * far larger than the data ever written to it. The directory holds
 * `_metadata` (the file size, then the capacity in bytes) and the files
 * `0`, `1`, ... Same constructors, methods and directory layout as UMap's,
 * so a directory written by either is read by the other.
 *
 *   SparseStore(rsize, aligned_size, root_path, file_size)
 *       create mode: makes root_path (an error if it exists), files of
 *       file_size rounded up to aligned_size (use the page size);
 *   SparseStore(root_path, read_only)
 *       open mode: an existing directory.
 *
 * Errors (directory exists / missing, metadata unreadable, a file that
 * cannot be opened) throw std::runtime_error with the reason; UMap
 * aborts. Differences: files are opened without O_DIRECT (upager hands
 * write_to_store() buffers of its own, not page-aligned), and an access
 * that spans two files is cut at the boundary (upager continues it in the
 * next file; UMap would have written past the first file's end).
 *
 * Header-only (see <umap/store/Store.hpp>); use it with Umap::umap_ex().
 */
#ifndef _UMAP_SPARSE_STORE_H_
#define _UMAP_SPARSE_STORE_H_

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "umap/store/Store.hpp"
#include "umap/umap.h"

namespace Umap {

class SparseStore : public Store {
public:
    /* Create mode. */
    SparseStore(size_t _rsize_, size_t _aligned_size_, std::string _root_path_,
                size_t _file_Size_)
        : file_size(0), current_capacity(0), rsize(_rsize_),
          aligned_size(_aligned_size_ ? _aligned_size_ : 4096),
          read_only(false), root_path(_root_path_) {
        if (_file_Size_ == 0)
            throw std::runtime_error("SparseStore: file size 0");
        file_size = (_file_Size_ + aligned_size - 1) / aligned_size * aligned_size;
        current_capacity = file_size > rsize ? file_size : rsize;
        if (::mkdir(root_path.c_str(), 0755) != 0) {
            if (errno == EEXIST)
                throw std::runtime_error(
                    "SparseStore: directory " + root_path +
                    " already exists: open it with SparseStore(root_path, read_only)");
            fail("creating directory " + root_path);
        }
        std::ofstream m((root_path + "/_metadata").c_str());
        if (!m.is_open())
            fail("creating " + root_path + "/_metadata");
        m << file_size << std::endl << current_capacity;
        if (!m.good())
            fail("writing " + root_path + "/_metadata");
        fds.assign(count_files(), -1);
    }

    /* Open mode. */
    SparseStore(std::string _root_path_, bool _read_only_)
        : file_size(0), current_capacity(0), rsize(0), aligned_size(4096),
          read_only(_read_only_), root_path(_root_path_) {
        std::ifstream m((root_path + "/_metadata").c_str());
        if (!m.is_open())
            fail("opening " + root_path + "/_metadata (is " + root_path +
                 " a SparseStore directory?)");
        m >> file_size >> current_capacity;
        if (!m || file_size == 0)
            throw std::runtime_error("SparseStore: " + root_path +
                                     "/_metadata is not valid");
        rsize = current_capacity;
        fds.assign(count_files(), -1);
    }

    ~SparseStore() override { close_files(); }

    ssize_t read_from_store(char *buf, size_t nb, off_t off) override {
        size_t n = nb;
        int fd = get_fd(off, n);
        if (fd < 0)
            return -1;
        return ::pread(fd, buf, n, off % (off_t)file_size);
    }

    ssize_t write_to_store(char *buf, size_t nb, off_t off) override {
        size_t n = nb;
        int fd = get_fd(off, n);
        if (fd < 0)
            return -1;
        return ::pwrite(fd, buf, n, off % (off_t)file_size);
    }

    /* Bytes the store holds (the larger of the region and one file). */
    size_t get_current_capacity() { return current_capacity; }

    /* The capacity recorded in base_path/_metadata, without opening it. */
    static size_t get_capacity(std::string base_path) {
        std::ifstream m((base_path + "/_metadata").c_str());
        size_t fsize = 0, capacity = 0;
        if (!(m >> fsize >> capacity))
            throw std::runtime_error("SparseStore: cannot read " + base_path +
                                     "/_metadata");
        return capacity;
    }

    /* Closes the files opened so far; 0, or nonzero if a close failed. */
    int close_files() {
        std::lock_guard<std::mutex> g(lock);
        int status = 0;
        for (int &fd : fds) {
            if (fd >= 0) {
                status |= ::close(fd);
                fd = -1;
            }
        }
        return status;
    }

private:
    size_t file_size;
    size_t current_capacity;
    size_t rsize;
    size_t aligned_size;
    bool read_only;
    std::string root_path;
    std::vector<int> fds;
    std::mutex lock;

    size_t count_files() const {
        return (current_capacity + file_size - 1) / file_size;
    }

    [[noreturn]] static void fail(const std::string &what) {
        throw std::runtime_error("SparseStore: " + what + ": " +
                                 std::strerror(errno));
    }

    /* The descriptor of the file holding `off` (opened, and created and
     * allocated unless read-only, on first use); cuts *n at the file's
     * end. -1 with errno on failure. */
    int get_fd(off_t off, size_t &n) {
        if (off < 0) {
            errno = EINVAL;
            return -1;
        }
        size_t index = (size_t)off / file_size;
        size_t in_file = (size_t)off % file_size;
        if (n > file_size - in_file)
            n = file_size - in_file;
        std::lock_guard<std::mutex> g(lock);
        if (index >= fds.size())
            fds.resize(index + 1, -1);
        if (fds[index] < 0) {
            std::string name = root_path + "/" + std::to_string(index);
            int fd = ::open(name.c_str(),
                            (read_only ? O_RDONLY : O_RDWR | O_CREAT) | O_CLOEXEC,
                            0600);
            if (fd < 0)
                return -1;
            if (!read_only) {
                int e = ::posix_fallocate(fd, 0, (off_t)file_size);
                if (e != 0) {
                    ::close(fd);
                    errno = e;
                    return -1;
                }
            }
            fds[index] = fd;
        }
        return fds[index];
    }
};

} /* namespace Umap */

#endif /* _UMAP_SPARSE_STORE_H_ */
