/*
 * umap/umap.h - LLNL UMap's C API, served by upager.
 *
 * A program written for UMap (https://github.com/LLNL/umap) builds against
 * upager by changing only the include path and the link flag: the same
 * functions, types, constants and environment variables, linked with -lumap
 * (libumap.so is installed as another name of libupager.so) or -lupager.
 * UMap's C++ API is here too: Umap::umap_ex() below, the abstract
 * Umap::Store in <umap/store/Store.hpp> and Umap::SparseStore in
 * <umap/store/SparseStore.h>, header-only (inline, over
 * upager_umap_store()), so -lumap stays the only library and C programs do
 * not pull in libstdc++. Not provided: UMap's client/server (mpumap)
 * functions. docs/umap.md lists every UMap entry point with upager's
 * behaviour.
 *
 * All umap() regions share one process-wide pager, created at the first
 * umap() call from these environment variables (read once, at the first
 * call of any function here):
 *
 *   UMAP_PAGESIZE          page size in bytes; upager's folio: the unit of
 *                          fill, eviction and I/O. A power of two from 4096
 *                          to 2097152 (UMap takes any multiple of the system
 *                          page size; others make umap() fail with EINVAL).
 *                          Default: the system page size (4096), as UMap.
 *   UMAP_BUFSIZE           buffer size in pages: the pager's hard budget is
 *                          UMAP_BUFSIZE x UMAP_PAGESIZE bytes. Default: 90%
 *                          of MemAvailable, as UMap. Any size works, down to
 *                          one page (UMap crashes below about 36 pages).
 *   UMAP_PAGE_FILLERS      fault-handler threads (clamped to 1..64).
 *                          Default: the number of CPUs, as UMap.
 *   UMAP_PAGE_EVICTORS     reported by umapcfg_get_num_evictors() only:
 *                          upager evicts with one background reclaimer plus
 *                          the faulting threads when the budget is full.
 *                          Default: the number of CPUs.
 *   UMAP_EVICT_HIGH_WATER_THRESHOLD, UMAP_EVICT_LOW_WATER_THRESHOLD
 *                          percent of the buffer, defaults 90 and 70 as
 *                          UMap. UMap evicts from the high mark down to the
 *                          low mark; upager evicts that many pages per batch
 *                          (at least 1; at most 1024 and 4 MiB, one
 *                          process_madvise call, one TLB shootdown). Its
 *                          background reclaimer keeps its own watermarks
 *                          near the budget.
 *   UMAP_MAX_FAULT_EVENTS  reported only (default 256).
 *   UMAP_READ_AHEAD        pages read ahead on SEQUENTIAL faults (random
 *                          faults read one page). Default when unset:
 *                          upager's adaptive readahead, growing up to
 *                          2 MiB (UMap: 0); 0 turns readahead off.
 *   UMAP_LOG_LEVEL         ERROR, WARNING, INFO or DEBUG. Messages go to
 *                          stderr. Default: WARNING (UMap: INFO, on stdout).
 *   UPAGER_FAULT_MODE      upager's own: "handlers" or "in-thread"
 *                          (unset: handlers where the process may open
 *                          /dev/userfaultfd, else in-thread, as for an
 *                          ordinary user), the fault mode of the pager (see
 *                          enum upager_fault_mode in <upager.h>), so an
 *                          unmodified UMap program can run in either. Read
 *                          when the pager is created; a value that names no
 *                          mode makes umap() fail with EINVAL (message on
 *                          stderr). In-thread: the faulting thread resolves
 *                          its own fault (no handler-thread wakeup), BUT a
 *                          system call on a non-resident page of a region
 *                          (write(fd, addr, n), read(fd, addr, n)) fails
 *                          with EFAULT instead of faulting it in: call
 *                          umap_fetch_and_pin() on the range first (it
 *                          stays resident until uunmap), or use
 *                          upager_pin()/upager_unpin() of <upager.h>, or
 *                          copy through a buffer of your own.
 *                          upager_umap_fault_mode() in <upager.h> tells the
 *                          mode in force.
 * Numbers may also be written with a unit (UMAP_PAGESIZE=64K).
 *
 * Where upager differs from UMap, on purpose:
 *   - umap() honours `offset` (UMap ignores it and always maps from 0). It
 *     must be a multiple of UMAP_PAGESIZE. `length` need not be a multiple
 *     of the page size; offset + length must not pass the end of the file.
 *   - Errors return UMAP_FAILED / -1 with errno set and a message on stderr
 *     (and in upager_last_error() from <upager.h>), instead of aborting.
 *   - uunmap() writes dirty pages back and releases all of the region's
 *     memory (UMap leaves it resident); on a write-back error it returns -1
 *     and the region stays mapped.
 *   - Small buffers work (UMap crashes with fewer than about 36 pages); the
 *     budget is never exceeded (counter resident_peak_bytes).
 *   - Regions still mapped when the process calls exit() are flushed by an
 *     atexit handler: writes persist, as with mmap(MAP_SHARED).
 *   - Each umap() call makes its own region, also for a descriptor already
 *     mapped (UMap hands back the first region of the same fd). Do not map
 *     overlapping ranges of one file writable twice: each has its own cache.
 *   - The descriptor is duplicated: it may be closed after umap() returns.
 *     It must be open O_RDWR for PROT_WRITE (else EACCES).
 *   - UMAP_FIXED maps at `addr` (a multiple of UMAP_PAGESIZE), replacing
 *     [addr, addr + length rounded up to UMAP_PAGESIZE) as MAP_FIXED does;
 *     several regions may sit side by side in one reservation. umap()
 *     regions in that range are replaced: each is written back and
 *     unmapped whole, also one only partly inside (MAP_FIXED would keep
 *     its rest mapped; a WARNING says so); its range stays reserved,
 *     inaccessible (SIGSEGV), for later UMAP_FIXED calls over it - what
 *     umapsort's multi-file mode needs (it maps its files over a umap() of
 *     its base file). A
 *     hint `addr` without UMAP_FIXED is ignored, as UMap's mmap would.
 *   - umap_fetch_and_pin() pins at most half of UMAP_BUFSIZE (see below).
 *
 * fork(): regions are not inherited by children, and a child of a process
 * that has called umap() cannot use umap() (the pager's threads stay in
 * the parent); fork before the first umap() call, or exec.
 *
 * Requirements: Linux 6.16 or later and access to /dev/userfaultfd (root,
 * or the device's permissions); see <upager.h>.
 */
#ifndef _UMAP_H_
#define _UMAP_H_

#include <stdint.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Maps `length` bytes of the file open as `fd`, starting at `offset`.
 * prot: PROT_READ, optionally | PROT_WRITE (writes go back to the file on
 * eviction, umap_flush() and uunmap()). flags: UMAP_PRIVATE (required, as
 * UMap), optionally | UMAP_FIXED (then addr is where; see above).
 * Returns the region's address (aligned to UMAP_PAGESIZE), or UMAP_FAILED
 * with errno: EINVAL (bad prot/flags/length/offset/page size, range past
 * the end of the file), EBADF (fd not open), EACCES (fd not readable, or
 * not writable with PROT_WRITE), EINVAL also for a UMAP_FIXED address that
 * is unaligned, the errno of writing back a umap() region it replaces, EPERM (no
 * access to /dev/userfaultfd), ENOMEM (no address space). */
void *umap(void *addr, size_t length, int prot, int flags, int fd,
           off_t offset);

/* Writes the region's dirty pages back (fdatasync), unmaps it and releases
 * its memory. addr is the address umap() returned; length is checked (not
 * beyond the region) but the whole region is always unmapped, as UMap.
 * Returns 0, or -1 with errno: EINVAL (not a umap() address), or the errno
 * of the failed write-back (the region then stays mapped). */
int uunmap(void *addr, size_t length);

/* Writes every umap() region's dirty pages back and makes the files durable
 * (fdatasync): when it returns 0, the files hold every write made before
 * the call. Returns 0, or -1 with errno of the first failure (dirty data
 * stays in memory; call again). */
int umap_flush(void);

/* One page to prefetch: any address inside it. */
struct umap_prefetch_item {
    void *page_base_addr;
};

/* Brings the npages listed pages (each UMAP_PAGESIZE bytes) into memory
 * before they are touched; returns when they are resident. The first page
 * outside every umap() region ends the call (errno EINVAL, message on
 * stderr). Prefetched pages count against the budget like any other. */
void umap_prefetch(int npages, struct umap_prefetch_item *page_array);

/* Brings [paddr, paddr + size) into memory (capped at the region's end)
 * and pins it: it stays resident until uunmap(), as UMap's does. Pinned
 * pages count against UMAP_BUFSIZE, and at most half of it can be pinned:
 * beyond that the range is fetched without a pin (a WARNING says so). */
void umap_fetch_and_pin(char *paddr, uint64_t size);

/* 1: regions mapped with PROT_WRITE write back to their files. */
int umap_has_write_support(void);

struct upager_store_ops; /* <upager.h> */

/* upager's own: umap() over a store of your own callbacks (struct
 * upager_store_ops in <upager.h>) instead of a descriptor; what C++
 * Umap::umap_ex() with a Umap::Store calls. The store's offset `offset`
 * is the region's first byte; ops->length must cover offset + length.
 * Returns as umap(). */
void *upager_umap_store(void *addr, size_t length, int prot, int flags,
                        const struct upager_store_ops *ops, off_t offset);

/* Configuration getters: the values in force (environment or default). */
long     umapcfg_get_system_page_size(void);            /* bytes */
uint64_t umapcfg_get_umap_page_size(void);              /* UMAP_PAGESIZE, bytes */
uint64_t umapcfg_get_max_fault_events(void);            /* UMAP_MAX_FAULT_EVENTS */
uint64_t umapcfg_get_num_fillers(void);                 /* UMAP_PAGE_FILLERS */
uint64_t umapcfg_get_num_evictors(void);                /* UMAP_PAGE_EVICTORS */
uint64_t umapcfg_get_max_pages_in_buffer(void);         /* UMAP_BUFSIZE, pages */
uint64_t umapcfg_get_read_ahead(void);                  /* UMAP_READ_AHEAD, pages
                                                           (unset: 2 MiB / page size) */
int      umapcfg_get_evict_low_water_threshold(void);   /* percent */
int      umapcfg_get_evict_high_water_threshold(void);  /* percent */

#ifdef __cplusplus
}
#endif

/* Flags (mmap's values, as UMap). */
#define UMAP_PRIVATE MAP_PRIVATE /* required; regions behave like a shared
                                    file mapping of this process */
#define UMAP_FIXED   MAP_FIXED   /* map at addr (see umap()) */

/* Return value of a failed umap(). */
#define UMAP_FAILED ((void *)-1)

#ifdef __cplusplus
#include <upager.h>
#include <umap/store/Store.hpp>

namespace Umap {
/* UMap's umap_ex(): with store == nullptr, umap(addr, length, prot, flags,
 * fd, offset); with a store, the region pages from it: read_from_store()
 * fills a page, write_to_store() writes a dirty page back (on eviction,
 * umap_flush() and uunmap()), at the store offset `offset` + the page's
 * offset in the region. The store must outlive the region (uunmap() it
 * before deleting the store). Its methods run on upager's threads, several
 * at once: they must be thread-safe; an exception they throw fails that
 * page's read (SIGBUS for the access) or write (the data stays dirty, the
 * flush fails). fd is not used with a store. */
inline void *umap_ex(void *addr, std::size_t length, int prot, int flags,
                     int fd, off_t offset, Store *store) {
    if (store == nullptr)
        return ::umap(addr, length, prot, flags, fd, offset);
    struct upager_store_ops ops;
    upager_store_ops_init(&ops);
    ops.ctx = store;
    ops.length = (uint64_t)offset + length;
    ops.read = &detail::store_read;
    if (prot & PROT_WRITE)
        ops.write = &detail::store_write;
    return ::upager_umap_store(addr, length, prot, flags, &ops, offset);
}
} /* namespace Umap */
#endif /* __cplusplus */

#endif /* _UMAP_H_ */
