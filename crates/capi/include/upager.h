/*
 * upager.h - C API of upager, a user-space demand pager for Linux.
 *
 * A pager owns a hard memory budget. Regions mapped through it are ordinary
 * memory: pages arrive on first touch (userfaultfd) and leave again in
 * batches (one TLB shootdown per batch) when the budget is full; dirty
 * pages are written back to their file first. Use region memory from any
 * thread, from any code, and (in the default fault mode, handlers) from
 * system calls: read(fd, addr, n) works. In the in-thread fault mode a
 * system call on a non-resident page of a region fails with EFAULT: see
 * upager_options.fault_mode and upager_fault_in().
 *
 *     #include <upager.h>
 *
 *     struct upager_options po;
 *     upager_options_init(&po);
 *     po.budget = 256 << 20;                      // 256 MiB, hard
 *     upager_t *pg;
 *     int rc = upager_create(&po, &pg);
 *     if (rc < 0) { fprintf(stderr, "%s\n", upager_last_error()); exit(1); }
 *
 *     struct upager_map_options mo;
 *     upager_map_options_init(&mo);
 *     mo.flags = UPAGER_MAP_WRITE;                // read-write, 4 KiB folios
 *     upager_region_t *r;
 *     rc = upager_map_file(pg, "data.bin", &mo, &r);
 *     double *a = upager_region_addr(r);          // ordinary memory
 *     a[12345] += 1.0;
 *     rc = upager_flush(r);                       // durable when it returns 0
 *     rc = upager_unmap(r, 0);
 *     upager_destroy(pg);
 *
 * Build: cc prog.c $(pkg-config --cflags --libs upager) -pthread
 *        (installed by `make install-c PREFIX=DIR`; pkg-config needs
 *        PKG_CONFIG_PATH=DIR/lib/pkgconfig and the program DIR/lib in its
 *        run-time search path, e.g. -Wl,-rpath,DIR/lib).
 *
 * Requirements: Linux 6.16 or later, access to /dev/userfaultfd (root, or
 * the device's permissions). Regions are not inherited by fork() children.
 *
 * Errors: functions returning int return 0 (or a count) on success and a
 * NEGATIVE errno on failure, e.g. -ENOENT, -EINVAL, -EACCES, -EPERM (no
 * userfaultfd access), -ENOSYS (kernel too old), -EIO. The full message of
 * the last failure on the calling thread, saying what to do, is returned by
 * upager_last_error(); upager_strerror() gives the errno's short text.
 *
 * Threads: all functions are thread-safe, except that a handle must not be
 * used by another thread while upager_unmap() or upager_destroy() frees it.
 *
 * Memory errors: touching a region after it is unmapped raises SIGSEGV like
 * any unmapped memory; a read fault that cannot be served (the file cannot
 * be read) raises SIGBUS in the faulting thread (EFAULT inside a system
 * call); writing to a read-only region raises SIGSEGV like PROT_READ.
 *
 * Environment: UPAGER_FAULT_MODE=handlers|in-thread chooses the fault mode
 * where the program does not (upager_options_init, and the pager behind
 * umap() from <umap/umap.h>).
 */
#ifndef UPAGER_H
#define UPAGER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque handles. */
typedef struct upager upager_t;               /* a pager: budget + threads */
typedef struct upager_region upager_region_t; /* one mapped region */

/* ------------------------------------------------------------------------
 * Pager
 * ------------------------------------------------------------------------ */

/* How a pager resolves page faults (struct upager_options.fault_mode). The
 * names are the same on every face: "handlers" and "in-thread" (Rust
 * FaultMode, Python fault_mode=, the CLI's --fault-mode, UPAGER_FAULT_MODE).
 *
 *   UPAGER_FAULT_HANDLERS   Handler threads resolve faults
 *                           while the faulting thread sleeps in the kernel.
 *                           System calls on region memory fault pages in
 *                           like any access.
 *   UPAGER_FAULT_IN_THREAD  the faulting thread resolves its own fault, in
 *                           a SIGBUS handler upager installs (signals that
 *                           are not upager's go to the handler installed
 *                           before it, or get the default action). Saves a
 *                           handler thread's wakeup, the largest cost of a
 *                           fault on a VM. BUT a system call that reads or
 *                           writes a non-resident page of a region, e.g.
 *                           write(fd, addr, n), fails with EFAULT instead of
 *                           faulting it in: pass region memory to system
 *                           calls only after upager_fault_in() on the range
 *                           (retry on EFAULT: nothing pins it), or copy
 *                           through a buffer of your own.
 *   UPAGER_FAULT_FROM_ENV   whatever UPAGER_FAULT_MODE names when
 *                           upager_create() runs; if unset, upager
 *                           chooses: handlers where the process may have a
 *                           userfaultfd that serves system calls (root, or
 *                           access to /dev/userfaultfd), in-thread where
 *                           only a user-mode-only one may be had (an
 *                           ordinary user, no setup): system calls on
 *                           non-resident region memory fail with EFAULT
 *                           there in either mode (upager_info()).
 */
enum upager_fault_mode {
    UPAGER_FAULT_FROM_ENV = -1,
    UPAGER_FAULT_HANDLERS = 0,
    UPAGER_FAULT_IN_THREAD = 1
};

/* Pager options. Always initialise with upager_options_init() and then set
 * the fields you want: `size` lets later versions add fields. */
struct upager_options {
    size_t size;              /* sizeof(struct upager_options); set by init */
    uint64_t budget;          /* most bytes resident at once, over all the
                                 pager's regions. Default 256 MiB. With a
                                 chosen batch, at least batch x folio. */
    uint32_t batch;           /* folios evicted per batch (one TLB shootdown
                                 each), 1..1024. 0 = default: as many as
                                 cover 4 MiB, or half the budget if less. */
    uint32_t handler_threads; /* fault-handler threads, 1..64. 0 = default:
                                 the number of CPUs, at most 4. */
    int64_t readahead;        /* largest readahead in bytes on sequential
                                 faults. -1 = default (2 MiB); 0 = off. */
    const char *swap_dir;     /* directory for anonymous regions' private
                                 swap files (created 0600, unlinked at once).
                                 NULL = default (TMPDIR or /tmp). Copied. */
    int direct_io;            /* O_DIRECT store I/O where the file system
                                 allows it, so the page cache holds no second
                                 copy outside the budget. -1 = default (on),
                                 0 = off, 1 = on. */
    int background_reclaim;   /* a reclaimer thread evicting between the
                                 watermarks. -1 = default (on), 0 = off (only
                                 faults reclaim, when the budget is full). */
    uint64_t dirty_limit;     /* most bytes of file data dirty (written, not
                                 yet written back) at once, 4 KiB..budget;
                                 writes beyond it wait for write-back, and a
                                 store that refuses writes (full disk) stops
                                 writes with SIGBUS but not reads. 0 =
                                 default (half the budget). */
    int fault_mode;           /* enum upager_fault_mode. Default (set by
                                 init): the mode UPAGER_FAULT_MODE names
                                 ("handlers" or "in-thread"), else
                                 UPAGER_FAULT_FROM_ENV (upager chooses at
                                 creation, see above). If the variable names
                                 no mode, init sets UPAGER_FAULT_FROM_ENV and
                                 upager_create() fails with -EINVAL and a
                                 message naming the variable (set the field
                                 to override it). */
    int64_t dirty_expire_ms;  /* file data dirty for longer than this many
                                 milliseconds is written back in the
                                 background (kept resident), so a process
                                 killed without upager_flush() keeps every
                                 write older than this (plus a quarter of
                                 it): in the page cache, durable only after
                                 upager_flush(). -1 = default (5000); 0 =
                                 off. */
    int huge_runs;            /* mixed folio sizes: a writable file region of
                                 folios below 2 MiB and at least 8 MiB fills
                                 a 2 MiB-aligned run read in sequence as one
                                 huge page (random faults keep the region's
                                 folios). Counters thp_fills, thp_evictions.
                                 -1 = default (off), 0 = off, 1 = on. */
    int readahead_async;      /* async readahead: once a sequential stream's
                                 readahead window has grown to its largest,
                                 the prefetch thread reads the next window
                                 on another CPU while the stream's fault
                                 reads this one. Counter readahead_async.
                                 -1 = default (on), 0 = off, 1 = on. */
    const char *cache_dir;    /* the disk tier: what read-only regions of an
                                 S3 object fetch stays in this directory
                                 (keyed by the object's ETag) for later
                                 faults, passes and runs. NULL = default
                                 (UPAGER_CACHE_DIR, else
                                 ~/.cache/upager/tier). */
    int64_t cache_size;       /* the disk tier's size in bytes (least
                                 recently used entries go first); -1 =
                                 default (UPAGER_CACHE_SIZE, else 20 GiB or
                                 half the disk's free space), 0 = off.
                                 Counters cache_hits, cache_misses, ... in
                                 upager_region_store_counters. */
};

/* Fills *opts with the defaults (including opts->size; fault_mode from
 * UPAGER_FAULT_MODE). NULL is ignored. */
void upager_options_init(struct upager_options *opts);

/* Creates a pager and stores its handle in *out. opts may be NULL for all
 * defaults. Starts the fault-handler and reclaimer threads.
 * Needs no privilege: without access to /dev/userfaultfd, upager opens a
 * user-mode-only userfaultfd (upager_info()).
 * Returns 0, or -EINVAL (bad option), -EPERM / -ENOSYS (userfaultfd refused
 * in every form: a seccomp filter, as in a container; or
 * UPAGER_USERFAULTFD=kernel-faults without access: the message says what to
 * do), -ENOSYS (kernel lacks a needed userfaultfd feature, named in the
 * message), or the errno of a failed thread/eventfd creation. */
int upager_create(const struct upager_options *opts, upager_t **out);

/* The pager's fault mode: UPAGER_FAULT_HANDLERS or UPAGER_FAULT_IN_THREAD
 * (never UPAGER_FAULT_FROM_ENV: resolved at creation); -EINVAL for NULL. */
int upager_fault_mode(const upager_t *pager);

/* "handlers" or "in-thread" (static strings); NULL for any other value,
 * UPAGER_FAULT_FROM_ENV included. */
const char *upager_fault_mode_name(int mode);

/* What the kernel (and any seccomp filter) let a pager use, probed when it
 * was created (features, never the kernel version); the names are those of
 * every face (Rust PagerInfo, Python Pager.info()). Flags are 0 or 1. */
struct upager_info {
    size_t size;           /* sizeof(struct upager_info): set it first */
    int fault_mode;        /* enum upager_fault_mode, as upager_fault_mode() */
    int user_mode_only;    /* a user-mode-only userfaultfd (an ordinary
                              user's; or UPAGER_USERFAULTFD=user-mode-only):
                              system calls on non-resident region memory
                              fail with EFAULT, in either fault mode */
    int syscalls_fault_in; /* system calls on region memory fault pages in
                              (handlers mode with a userfaultfd that serves
                              them); 0: upager_fault_in() first, or copy */
    int batched_unmap;     /* one process_madvise, one TLB flush, per
                              eviction batch; 0: one madvise (one flush) per
                              range (kernel before 6.13, or seccomp) */
    int io_uring;          /* write-back through io_uring; 0: pwrite */
    int uffd_move;         /* 2 MiB runs moved into views as huge pages */
    int uffd_poison;       /* UFFDIO_POISON (6.6); 0: upager sends the
                              thread SIGBUS itself */
    int pagemap_scan;      /* the PAGEMAP_SCAN ioctl (6.7) */
};

/* Fills *out (out->size set by the caller). Returns 0, or -EINVAL for a
 * NULL argument or a wrong size. */
int upager_info(const upager_t *pager, struct upager_info *out);

/* fork(): a child can use every file region it inherited, at the same
 * address (pointers taken before the fork stay valid), through the same
 * handles: before fork() returns in the child, upager starts a pager of
 * its own for each of the parent's (same options, a budget of the same
 * size, new threads) and maps each file region again there, cold. The
 * parent's writes made before fork() was called are flushed to the file
 * first, so the child sees them; later writes of either process reach the
 * other through the file (flush, eviction), as with MAP_SHARED, for bytes
 * in folios only one of them writes. Anonymous regions, and regions of
 * stores made with upager_map_store(), are not inherited: their range
 * stays reserved and inaccessible (SIGSEGV). The handlers are registered
 * with pthread_atfork() when the first pager is created.
 *
 * upager_after_fork() does the child's part by hand, for a child made
 * without the C library's fork() (a raw clone()); it does nothing in any
 * other process, and nothing the second time. */
void upager_after_fork(void);

/* Releases the pager handle. Regions already mapped stay valid (they keep
 * the pager's threads alive until the last of them is unmapped). NULL is
 * ignored. */
void upager_destroy(upager_t *pager);

/* ------------------------------------------------------------------------
 * Regions
 * ------------------------------------------------------------------------ */

/* Map flags. */
#define UPAGER_MAP_WRITE 1u /* read-write: writes reach the file on eviction
                               and on upager_flush(). Default read-only
                               (writes raise SIGSEGV). */
#define UPAGER_MAP_WARM 2u  /* warm start (files only: upager_map_file, or
                               upager_map_fd of a descriptor whose path
                               still names its file): replay the trace
                               beside the file (FILE.upager-trace) as
                               prefetch if it matches the file as it is
                               now, else record the order folios are first
                               needed and write it there at unmap.
                               Counters replay_reads, replay_hits,
                               replay_wasted. */
#define UPAGER_MAP_WARM_RECORD 4u /* warm start: always record a new trace
                               (with or without UPAGER_MAP_WARM). */

/* Region options. Always initialise with upager_map_options_init(). */
struct upager_map_options {
    size_t size;     /* sizeof(struct upager_map_options); set by init */
    uint64_t offset; /* start in the file, a multiple of the folio size.
                        Default 0. Must be 0 for anonymous regions. */
    uint64_t length; /* bytes to map. 0 = default: to the end of the file.
                        offset + length must not pass the end of the file
                        (extend it first with ftruncate). Must be 0 for
                        upager_map_anonymous (the length is an argument). */
    uint64_t folio;  /* unit of fill, eviction and accounting: a power of
                        two from 4096 to 2 MiB. 0 = default: 4 KiB for
                        files (a random fault fills 4 KiB, a sequential
                        stream its whole readahead window at once), 64 KiB
                        for anonymous regions, the chunk size for a
                        dataset on a store. */
    uint32_t flags;  /* UPAGER_MAP_* */
    void *addr;      /* NULL = default: upager chooses the address. Else the
                        region is mapped AT addr, replacing whatever the
                        caller had in [addr, addr + length rounded up to the
                        folio size) as mmap(MAP_FIXED) does (typically the
                        caller's own PROT_NONE reservation; several regions
                        may sit side by side in one). addr must be a
                        multiple of the folio size and length must be given
                        (else -EINVAL). Unmapping leaves the range unmapped,
                        as munmap() does. */
    const char *store; /* NULL = default: the data lives in the file (or, for
                        upager_map_anonymous, in a private local swap file).
                        Else a store URL, "redis-cluster://HOST:PORT[,HOST:PORT
                        ...][/NAME]": the region's data lives on that Redis
                        Cluster. Credentials ("redis-cluster://USER:PASSWORD@
                        HOST", ":PASSWORD@"), TLS ("rediss-cluster://...
                        ?ca=PATH") and the default port 6379 as docs/stores.md
                        says; messages print the password as
                        ***. upager_map_file(pager, NULL, opts, out) maps
                        the dataset NAME (uploaded with upager_store_load() or
                        `upager load`; the folio is its chunk size, or a
                        multiple of it if set); upager_map_anonymous() swaps to the
                        cluster (far memory; NAME is not used, its keys are
                        deleted at unmap). Writes are acknowledged by the
                        master and one replica (WAIT) before memory is
                        released, and upager_flush() returns only when every
                        earlier write is replicated. Errors: -EINVAL (bad URL),
                        -ECONNREFUSED (cluster unreachable), -ENOENT (no such
                        dataset). A master left without replicas by a
                        failover keeps taking writes (degraded, logged);
                        "?min_replicas=N" at the URL's end makes them fail
                        (-EIO from upager_flush) unless N replicas
                        acknowledge them.
                        Or an object of an S3-compatible store,
                        "s3://BUCKET/KEY" (credentials, region and endpoint
                        from AWS_* variables or ~/.aws, as the AWS SDKs read
                        them): upager_map_file(pager, NULL, opts, out) maps
                        it read-only (64 KiB folios unless set; a fault is
                        one ranged GET). -EROFS with UPAGER_MAP_WRITE,
                        -ENOENT (no such object or bucket), -EACCES
                        (credentials refused). A prefix URL,
                        "s3://BUCKET/NAME/", names a read-write dataset
                        (made with `upager load FILE s3://BUCKET/NAME/`):
                        mapped as the flags ask, each write-back a
                        conditional PUT (a group another writer changed
                        fails the write-back: -EIO from upager_flush, the
                        data kept dirty). upager_map_anonymous() with
                        "s3://BUCKET/" or "s3://BUCKET/PREFIX/" swaps to
                        objects under it, removed at unmap; with an object
                        URL it is -EINVAL. */
};

/* Fills *opts with the defaults (including opts->size). NULL is ignored. */
void upager_map_options_init(struct upager_map_options *opts);

/* Uploads the file at `path` as a new dataset on a Redis Cluster, named by
 * `url` ("redis-cluster://HOST:PORT/NAME"; NAME must not exist yet), in
 * chunks of `chunk` bytes (one key each; 0 = 64 KiB): regions then map it
 * with opts->store = url and a folio of the chunk size or a multiple.
 * Chunks of zeros are not stored. The dataset becomes visible only once
 * complete; an upload that fails is removed. A directory, FIFO or device is
 * refused (-EISDIR, -EINVAL) before anything is written.
 * Returns 0, or -EEXIST (NAME exists, or an upload of it is running),
 * -ECONNREFUSED (cluster unreachable), -ENOENT (no file), -EINVAL. The CLI's
 * `upager load FILE URL` does the same with a progress bar. */
int upager_store_load(const char *path, const char *url, uint64_t chunk);

/* A dataset on a Redis Cluster, as upager_store_list() reports it. */
struct upager_dataset {
    char name[256];   /* NUL-terminated (names are at most 200 bytes) */
    uint64_t length;  /* bytes */
    uint64_t chunk;   /* chunk size (one key each) */
    int complete;     /* 1: complete, it maps; 0: an upload that is running,
                         was interrupted or killed (a dataset is visible only
                         once its upload completed: mapping it fails with
                         -ENOENT; upager_store_delete() removes it, a new
                         upager_store_load() replaces it once it made no
                         progress for a minute) */
};

/* The datasets on the Redis Cluster `url` names ("redis-cluster://HOST:PORT";
 * a /NAME is ignored), complete or not, sorted by name. Stores the first
 * `cap` in out[] and returns how many there are (call with cap 0 to size
 * the array), or a negative errno (-ECONNREFUSED: cluster unreachable,
 * -EINVAL: bad URL). The CLI's `upager list URL` prints the same. */
int upager_store_list(const char *url, struct upager_dataset *out, size_t cap);

/* Deletes the dataset `url` names ("redis-cluster://HOST:PORT/NAME"),
 * complete or not: it disappears at once, then its keys are removed (a
 * running upload of it stops at its next batch). Returns 0, or -ENOENT (no
 * such dataset), -ECONNREFUSED, -EINVAL, -EIO (an error half-way: the
 * dataset stays invisible; call again to finish). The CLI's `upager delete
 * URL` does the same with a progress bar. */
int upager_store_delete(const char *url);

/* Maps the file at `path` (path NULL with opts->store set: the dataset on the
 * store that URL names) (opened read-only, or read-write with
 * UPAGER_MAP_WRITE). opts may be NULL for defaults (whole file, read-only,
 * 4 KiB folios). Stores the region handle in *out.
 * Returns 0, or -ENOENT (no such file), -EACCES (permission denied, or a
 * read-only file mapped for writing), -EINVAL (zero length, bad folio size,
 * unaligned offset, range past the end of the file, budget smaller than one
 * eviction batch of this folio size), -EISDIR (a directory), -ENODEV (a
 * FIFO, socket, character device or /proc-/sys-style pseudo-file: upager
 * pages regular files and block devices), -ENOMEM (no address space), or
 * the errno of a failed open/registration. */
int upager_map_file(upager_t *pager, const char *path,
                    const struct upager_map_options *opts,
                    upager_region_t **out);

/* Like upager_map_file() for an open file descriptor. The descriptor is
 * duplicated: close yours whenever you like. It must be open for reading,
 * and O_RDWR for UPAGER_MAP_WRITE (else -EACCES); -EBADF if not open;
 * -EISDIR / -ENODEV as upager_map_file() for what is not a regular file.
 * O_DIRECT is not used for regions mapped from a descriptor. */
int upager_map_fd(upager_t *pager, int fd,
                  const struct upager_map_options *opts,
                  upager_region_t **out);

/* Maps `length` bytes of anonymous memory: zero on first touch, always
 * writable, swapped to a private swap file in the pager's swap_dir when
 * evicted. opts may be NULL; only opts->folio is used (offset and length
 * must be 0, flags may include UPAGER_MAP_WRITE). Returns as
 * upager_map_file(). */
int upager_map_anonymous(upager_t *pager, uint64_t length,
                         const struct upager_map_options *opts,
                         upager_region_t **out);

/* A store of your own: upager pages the region from it and writes the
 * region back to it through these callbacks (a compressed file, remote
 * memory, an object store...). Initialise with upager_store_ops_init(),
 * then set ctx, length, read and (for a writable store) write.
 *
 * The callbacks run on upager's threads (fault handlers, the reclaimer, a
 * resolver thread in the in-thread mode; never in a signal handler),
 * several at once for different folios: they must be thread-safe. They may
 * block: the fault that needs the data waits, other faults go on. They
 * must not touch the region's own memory that is not resident (the fault
 * would wait for itself), and must not throw (C++) or longjmp out.
 *
 *   read     reads up to len bytes at offset into buf (page-aligned);
 *            returns the bytes read, or a negative errno. A short read is
 *            asked again for the rest; 0 before `length` is an error. An
 *            error makes the access that needed the data fail with SIGBUS
 *            (EFAULT in a system call), as an unreadable file does.
 *            Required.
 *   write    writes all len bytes of buf at offset; 0 or a negative errno.
 *            On error the data stays dirty in memory and upager_flush()
 *            returns the error. NULL: the store is read-only
 *            (UPAGER_MAP_WRITE is then refused with -EROFS).
 *   sync     makes every completed write durable (upager_flush() calls it
 *            last); 0 or a negative errno. NULL: nothing to do.
 *   release  called once when no region uses the store any more, also when
 *            upager_map_store() fails after accepting the struct. NULL:
 *            nothing to do.
 *
 * Offsets are the store's: the region's first byte is at
 * upager_map_options.offset. */
struct upager_store_ops {
    size_t size;       /* sizeof(struct upager_store_ops), set by _init */
    void *ctx;         /* passed to every callback */
    uint64_t length;   /* bytes in the store */
    int64_t (*read)(void *ctx, void *buf, size_t len, uint64_t offset);
    int (*write)(void *ctx, const void *buf, size_t len, uint64_t offset);
    int (*sync)(void *ctx);
    void (*release)(void *ctx);
};

/* Zeroes *ops and sets ops->size. */
void upager_store_ops_init(struct upager_store_ops *ops);

/* Maps a region over a store of your own (see struct upager_store_ops):
 * like upager_map_file() with opts->offset and opts->length in the store.
 * The struct is copied. -EINVAL for a NULL or uninitialised ops, a NULL
 * read callback, or the errors of upager_map_file(). */
int upager_map_store(upager_t *pager, const struct upager_store_ops *ops,
                     const struct upager_map_options *opts,
                     upager_region_t **out);

/* First byte of the region (aligned to the folio size); NULL for NULL. */
void *upager_region_addr(const upager_region_t *region);

/* Length in bytes as requested (the mapping is rounded up to whole folios;
 * bytes past the end of the file read as zero); 0 for NULL. */
uint64_t upager_region_length(const upager_region_t *region);

/* The region's folio size in bytes; 0 for NULL. */
uint64_t upager_region_folio(const upager_region_t *region);

/* 1 if the region is writable, 0 if read-only (or NULL). */
int upager_region_writable(const upager_region_t *region);

/* Writes every dirty folio back and makes the file durable (fdatasync):
 * when this returns 0, the file holds every write made before the call.
 * Writes racing with the flush are kept (they land after the copy and the
 * folio is dirty again). Nothing to do for read-only and anonymous regions.
 * Returns 0 or the errno of the failed write / fdatasync (the data stays in
 * memory, dirty; flush again once the file system is fixed). */
int upager_flush(const upager_region_t *region);

/* Unmap flags. */
#define UPAGER_UNMAP_FORCE 1u /* unmap and free even if writing dirty data
                                 back fails (that data is lost); the error
                                 is still returned. */

/* Writes dirty data back (as upager_flush) and unmaps the region, releasing
 * its memory (nothing stays resident) and swap space; frees the handle.
 * On a write-back error returns its negative errno and, without
 * UPAGER_UNMAP_FORCE, leaves the region mapped and the handle valid.
 * NULL returns 0. No other thread may use the handle during the call; other
 * threads' accesses to the memory afterwards raise SIGSEGV. */
int upager_unmap(upager_region_t *region, unsigned flags);

/* ------------------------------------------------------------------------
 * Residency and advice
 *
 * Ranges are in bytes from the region's start and must lie inside the
 * region (-EINVAL otherwise, also for length 0). Residency queries need a
 * 4 KiB-aligned offset; pageout, prefetch and discard a folio-aligned
 * offset and a length that is a multiple of the folio size or reaches the
 * region's end.
 * ------------------------------------------------------------------------ */

/* Residency states (struct upager_extent.state). */
#define UPAGER_RESIDENT_CLEAN 0 /* in memory, same as the file */
#define UPAGER_RESIDENT_DIRTY 1 /* in memory, written since last written back */
#define UPAGER_EVICTED        2 /* evicted: the contents are in the store */
#define UPAGER_NEVER_TOUCHED  3 /* never filled (or discarded) */
#define UPAGER_BUSY           4 /* a fill, eviction or write-back in flight */

/* A run of pages with the same state. */
struct upager_extent {
    uint64_t offset; /* bytes from the region's start */
    uint64_t length; /* bytes */
    int state;       /* UPAGER_RESIDENT_CLEAN .. UPAGER_BUSY */
};

/* Residency of [offset, offset + length) as runs of equal state, adjacent
 * runs merged, answered from upager's per-folio state words (no I/O, no
 * system call; "evicted" vs "never touched" is known without touching the
 * store). Stores the first `cap` runs in out[] and returns the number of
 * runs (call with cap 0 to size the array), or a negative errno. */
int upager_residency(const upager_region_t *region, uint64_t offset,
                     uint64_t length, struct upager_extent *out, size_t cap);

/* mincore(2)-shaped residency: vec[i] (one byte per 4 KiB page of the
 * range, (length + 4095) / 4096 bytes) gets bit 0 set if the page is in
 * memory. Returns 0 or a negative errno. */
int upager_mincore(const upager_region_t *region, uint64_t offset,
                   uint64_t length, unsigned char *vec);

/* Drops the clean resident folios that the range touches, so the next
 * access reads the file again: how a region sees writes another region or
 * process flushed after this region read those folios (a region sees
 * others' flushed writes to folios it faults in after the flush, as NFS's
 * close-to-open consistency; not later ones until it drops its copy).
 * Dirty folios (this region's own newer writes) and pinned ones stay.
 * Returns the number of folios dropped (0 for anonymous regions), or a
 * negative errno (-EINVAL for a range outside the region). */
int64_t upager_invalidate(const upager_region_t *region, uint64_t offset,
                          uint64_t length);

/* Writes back (if dirty) and evicts the resident folios of the range now,
 * in batches (one TLB shootdown per batch), like MADV_PAGEOUT. Returns the
 * number of folios evicted, or a negative errno (-EIO etc. when a
 * write-back failed: that data stays in memory, dirty). */
int64_t upager_pageout(const upager_region_t *region, uint64_t offset,
                       uint64_t length);

/* Starts filling the range in the background, like MADV_WILLNEED, and
 * returns at once. Prefetch stops early rather than evict more than one
 * batch to make room. Returns 0 or a negative errno. */
int upager_prefetch(const upager_region_t *region, uint64_t offset,
                    uint64_t length);

/* upager_fetch() flags. */
#define UPAGER_FETCH_WRITE 1u /* the caller writes the bytes at every offset
                                 next (a scatter): the folios go in writable
                                 and dirty, as write faults would leave them
                                 (a file region of folios above 4 KiB: only
                                 the 4 KiB page the offsets fall in, when
                                 they fall in one), so the writes fault no
                                 more; under the dirty limit, as write
                                 faults are; a folio named but not written
                                 is written back unchanged (needs a
                                 writable region) */

/* Reads the folios holding the bytes at offsets[0..count) in now, in the
 * calling thread, in batches of up to 8 MiB of folios whose reads go to the
 * store together (an object store's GETs in flight at once, where faults
 * one at a time would each wait a round trip): for a gather or scatter
 * whose index set is known before it runs. Offsets in any order, repeats
 * allowed (read in address order); resident folios are skipped. Makes room
 * first (up to half the budget), then stops early rather than evict more
 * than a batch per batch: keep a call's folios well under the budget.
 * Returns the folios read, -EINVAL (an offset outside the region: nothing
 * read; flags; offsets NULL with count > 0) or -EOPNOTSUPP
 * (UPAGER_FETCH_WRITE on a read-only region). */
int64_t upager_fetch(const upager_region_t *region, const uint64_t *offsets,
                     size_t count, unsigned flags);

/* upager_fault_in() flags. */
#define UPAGER_FAULT_IN_WRITE 1u /* as write faults: the folios become dirty,
                                    as the system call that follows will make
                                    them (needs a writable region) */

/* Makes [offset, offset + length) resident now, in the calling thread, as
 * faults there would, without touching the memory; any offset and length
 * inside the region. For passing region memory to a system call in the
 * in-thread fault mode, where a system call on a non-resident page fails
 * with EFAULT: fault the range in, then make the call. Nothing pins the
 * range: under memory pressure a folio may be evicted again before the
 * call, so keep such ranges well under the budget and retry a call that
 * fails with EFAULT. Works in both fault modes. Returns 0, -EINVAL (range
 * or flags), -EOPNOTSUPP (UPAGER_FAULT_IN_WRITE on a read-only region) or
 * -EFAULT (a folio cannot be filled: its store read failed). */
int upager_fault_in(const upager_region_t *region, uint64_t offset,
                    uint64_t length, unsigned flags);

/* upager_pin() flags. */
#define UPAGER_PIN_WRITE 1u /* the folios become dirty and stay writable */

/* Pins [offset, offset + length): makes it resident (as upager_fault_in())
 * and keeps it so - eviction, pageout and discard leave it alone - until
 * upager_unpin(). Pins are counted: each pin needs one unpin. For buffer
 * pools (fix/unfix) and for system calls on region memory in the in-thread
 * fault mode. Pinned memory counts against the budget; at most half the
 * budget may be pinned. flush still writes pinned folios back. Unmapping
 * drops every pin. Returns 0, -EINVAL (range or flags), -EOPNOTSUPP
 * (UPAGER_PIN_WRITE on a read-only region), -ENOMEM (more than half the
 * budget would be pinned; nothing was pinned) or -EFAULT (a folio cannot
 * be filled, or its write is refused by a full disk; nothing stays
 * pinned). */
int upager_pin(const upager_region_t *region, uint64_t offset,
               uint64_t length, unsigned flags);

/* Undoes one upager_pin() of the range. Returns 0 or -EINVAL (range, or a
 * folio in it that is not pinned: then nothing is unpinned). */
int upager_unpin(const upager_region_t *region, uint64_t offset,
                 uint64_t length);

/* Waits until every prefetch queued so far on the region's pager has
 * finished: 0, or -ETIMEDOUT after timeout_ms milliseconds. */
int upager_prefetch_wait(const upager_region_t *region, uint32_t timeout_ms);

/* Drops the contents of the range, like MADV_DONTNEED on private memory:
 * anonymous memory reads as zero again and its swap space is freed; a
 * file-backed range is read from the file again on the next access.
 * WRITES IN THE RANGE NOT YET FLUSHED OR EVICTED ARE LOST. Returns 0 or a
 * negative errno (-EOPNOTSUPP where the region cannot drop data). */
int upager_discard(const upager_region_t *region, uint64_t offset,
                   uint64_t length);

/* ------------------------------------------------------------------------
 * Counters
 *
 * Stable snake_case names, the same in the Rust API (Stats::NAMES), the
 * Python package (Pager.stats()) and the `upager stat` command; new names
 * are only ever added at the end. Examples: faults_missing, faults_wp,
 * fills, bytes_read, bytes_written, evictions, evict_batches,
 * tlb_flush_batches, writebacks, resident_bytes, resident_peak_bytes
 * (never above the budget), budget_bytes, flushes.
 * ------------------------------------------------------------------------ */

/* Number of counters. */
size_t upager_stat_count(void);

/* Name of counter i (0 <= i < upager_stat_count()), a static string; NULL
 * past the end. */
const char *upager_stat_name(size_t i);

/* Stores the pager's counter `name` in *value. Returns 0, or -ENOENT for an
 * unknown name (the message lists the names), -EINVAL for NULL arguments. */
int upager_stat(const upager_t *pager, const char *name, uint64_t *value);

/* Same, for the pager a region belongs to (also after upager_destroy), and
 * the region's store's own counters where it keeps them (store_*: an S3
 * object or dataset, a Redis Cluster dataset: store_gets,
 * store_bytes_received, ...). */
int upager_region_stat(const upager_region_t *region, const char *name,
                       uint64_t *value);

/* Stores up to n counters in name order (values[i] is the counter named
 * upager_stat_name(i)); returns the number of counters (which may be more
 * than n), or a negative errno. */
int upager_stats(const upager_t *pager, uint64_t *values, size_t n);

/* Counter `name` of the process-wide pager behind umap() (umap/umap.h),
 * creating it from the UMAP_* environment variables if no umap() call has
 * yet. Returns as upager_stat(). */
int upager_umap_stat(const char *name, uint64_t *value);

/* Fault mode (UPAGER_FAULT_HANDLERS or UPAGER_FAULT_IN_THREAD) of the
 * process-wide pager behind umap(), creating it as upager_umap_stat() does;
 * a negative errno if it cannot be created (-EINVAL when UPAGER_FAULT_MODE
 * names no mode). */
int upager_umap_fault_mode(void);

/* What the kernel let the process-wide pager behind umap() use (see
 * upager_info()), creating it as upager_umap_stat() does. */
int upager_umap_info(struct upager_info *out);

/* ------------------------------------------------------------------------
 * Errors and version
 * ------------------------------------------------------------------------ */

/* Short static text for an errno value, positive or negative
 * ("No such file or directory"). Thread-safe. */
const char *upager_strerror(int err);

/* Full message of the last failed upager call (native or umap face) on the
 * calling thread, e.g. "data.bin: no such file (create it first, or map
 * anonymous memory)"; "" if none failed yet. Valid until the next failing
 * call on this thread. */
const char *upager_last_error(void);

/* Library version, like "0.1.0". */
const char *upager_version(void);

#ifdef __cplusplus
}
#endif

#endif /* UPAGER_H */
