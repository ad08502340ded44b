//! Stores: where a region's data lives when it is not resident.
//!
//! - [`FileStore`]: an existing file (or a range of it), read-only or
//!   read-write. Aligned I/O goes through an `O_DIRECT` descriptor when the
//!   file system allows it, so the kernel's page cache keeps no second copy
//!   outside the budget; the unaligned tail uses the buffered descriptor.
//! - [`SwapFile`]: the private swap file of an anonymous region, created
//!   0600 and unlinked at once, addressed in slots handed out by [`Slots`].
//! - Anything implementing [`Store`] (tests wrap a store to inject faults).
//!
//! Write-back hands a store all the writes of one batch at once
//! ([`Store::write_batch`]). The file store and the swap file submit them
//! together through io_uring (rings from a process-wide pool, one per
//! thread writing at a time) and return when every one has completed, so
//! the store works on them in parallel where it can and one batch of
//! scattered 4 KiB folios costs a few `io_uring_enter` calls instead of one
//! `pwrite` each. Where io_uring is unavailable they write one by one (and
//! log that once). The default for other stores loops over
//! [`Store::write_from`].
//!
//! [`Slots`] is the store index that reclaim updates (seed 003): a batch of
//! evicted folios gets its slots under one lock acquisition, and a batch of
//! discarded folios returns them under one, their holes punched before (a
//! freed slot may be reused at once, so a punch after the free could wipe
//! the new owner's data).
//!
//! O_DIRECT refused after open. Some file systems accept `O_DIRECT` at
//! open and fail the I/O with `EINVAL` (FUSE file systems such as LazyFS;
//! `EOPNOTSUPP` is treated alike). Contract of [`FileStore`] and
//! [`SwapFile`] (their shared [`Fds`]):
//!
//! ```text
//!   I/O through the direct descriptor fails with EINVAL/EOPNOTSUPP
//!     1) mark the store's direct descriptor refused (one atomic, never cleared)
//!     2) do the same I/O again, whole, through the buffered descriptor
//!        (a write may have landed in part: rewriting the same bytes is harmless)
//!     3) every later I/O of the store goes buffered
//!     4) log once, naming the file and the refused call, outside any SIGBUS
//!        handler: at the next store call that is not in one, or at close
//! ```
//!
//! Steps 1-3 are async-signal-safe (an atomic and `pread`/`pwrite`, no
//! allocation, no lock): an in-thread fault's read falls back inside the
//! SIGBUS handler and the access goes on. Only the log waits. No access
//! ends because of the refusal: the error is returned only if the buffered
//! I/O fails too. Ordering: Relaxed everywhere, the flag only chooses
//! between two descriptors that are valid at all times, and the kernel
//! keeps direct and buffered I/O of one inode coherent.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use upager_sys::mem::Mapping;
use upager_sys::uring::{WriteOp, WriteRing};
use upager_sys::PAGE_SIZE;

use crate::error::FileKind;

/// Region memory about to be written to a store: a resident, write-protected
/// folio (or run of folios) of the application's view. Stores read it with
/// [`Src::write_to`] (one `pwrite` from the mapping) or [`Src::copy_to`].
#[derive(Debug, Clone, Copy)]
pub struct Src<'a> {
    pub(crate) map: &'a Mapping,
    pub(crate) off: usize,
    pub(crate) len: usize,
}

impl Src<'_> {
    /// Bytes to write.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True if there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Address of the first byte (page-aligned).
    pub fn addr(&self) -> u64 {
        self.map.addr() + self.off as u64
    }
    /// Copies the bytes out.
    pub fn copy_to(&self, buf: &mut [u8]) {
        self.map.read_at(self.off, &mut buf[..self.len]);
    }
    /// Writes all bytes to `file` at `offset` straight from the mapping
    /// (retrying short writes).
    pub fn write_to(&self, file: &File, offset: u64) -> io::Result<()> {
        let mut done = 0u64;
        while done < self.len as u64 {
            let n = upager_sys::io::pwrite_from(
                file,
                self.addr() + done,
                self.len as u64 - done,
                offset + done,
            )?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "store accepted no bytes",
                ));
            }
            done += n;
        }
        Ok(())
    }
}

/// One write of a batch: all of `src` at store offset `offset`.
#[derive(Debug, Clone, Copy)]
pub struct Write<'a> {
    /// The bytes.
    pub src: Src<'a>,
    /// Where they go.
    pub offset: u64,
}

/// What [`Store::write_batch`] did: one result per write, in order, and
/// how many submissions to the operating system it took.
#[derive(Debug)]
#[non_exhaustive]
pub struct Written {
    /// `results[i]` is the outcome of write `i` (all of its bytes, or an
    /// error).
    pub results: Vec<io::Result<()>>,
    /// System calls that submitted writes (`io_uring_enter`, `pwrite`):
    /// the engine's `writeback_submits` counter sums them.
    pub submissions: u64,
}

impl Written {
    /// A batch's outcome: one result per write, and the submissions made.
    pub fn new(results: Vec<io::Result<()>>, submissions: u64) -> Written {
        Written {
            results,
            submissions,
        }
    }
}

/// One read of a batch: fill `buf` from store offset `offset`
/// ([`Store::read_batch`]).
#[derive(Debug)]
pub struct ReadReq<'a> {
    /// Where the bytes go (page-aligned, a multiple of 4 KiB).
    pub buf: &'a mut [u8],
    /// Where they come from.
    pub offset: u64,
}

/// A backing store. Implementations must be thread-safe: fault handlers and
/// the reclaimer call them concurrently for different folios.
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Size in bytes (reads beyond it return 0 bytes).
    fn len(&self) -> u64;
    /// True if the store has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether writes are allowed.
    fn writable(&self) -> bool;
    /// Reads into `buf` from `offset`; returns the bytes read, fewer only at
    /// the end of the store. `buf` is page-aligned and a multiple of 4 KiB.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Reads every read of `reads` (separate folios the engine wants at
    /// once) and returns one result per read, in order, each as
    /// [`Store::read_at`] would. A network store sends them together (one
    /// round trip per server instead of one per read). Default: one
    /// [`Store::read_at`] per read, in order.
    fn read_batch(&self, reads: &mut [ReadReq<'_>]) -> Vec<io::Result<usize>> {
        reads
            .iter_mut()
            .map(|r| self.read_at(r.buf, r.offset))
            .collect()
    }
    /// Writes all of `src` at `offset`, or fails.
    fn write_from(&self, src: Src<'_>, offset: u64) -> io::Result<()>;
    /// Writes every write of `batch` and returns once each one has
    /// completed or failed, with one result per write (the engine keeps
    /// exactly the folios of failed writes dirty). The writes do not
    /// overlap; their order is not significant. Default: one
    /// [`Store::write_from`] per write, in order (one submission each).
    fn write_batch(&self, batch: &[Write<'_>]) -> Written {
        let results: Vec<_> = batch
            .iter()
            .map(|w| self.write_from(w.src, w.offset))
            .collect();
        Written::new(results, batch.len() as u64)
    }
    /// Makes every completed write durable (fdatasync).
    fn sync(&self) -> io::Result<()>;
    /// Frees the space of `[offset, offset+len)` (swap slots). Default: no-op.
    fn punch(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// What the store is, for messages: "file /data/w.bin", "swap file in
    /// /tmp", "Redis Cluster dataset NAME at HOST:PORT". Default: its
    /// `Debug` text.
    fn describe(&self) -> String {
        format!("{self:?}")
    }
    /// The store's own counters with their stable snake_case names
    /// (`store_` prefix: requests and bytes on the wire for a network
    /// store), which the faces show beside the pager's
    /// ([`Region::store_counters`](crate::Region::store_counters)). Default
    /// none.
    fn store_counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    /// Whether every read is a round trip to a server (a network store),
    /// so that a batch of reads ([`Store::read_batch`]) in flight together
    /// costs little more than one: background prefetch, warm-start replay
    /// and a stream's async readahead window then read in batches of 8 MiB
    /// of folios, as `Region::fetch` does, instead of 1 MiB (a window: the
    /// readahead, 2 MiB) (ahead.rs). Default false.
    fn round_trips(&self) -> bool {
        false
    }
    /// Whether `read_at` may run in a SIGBUS handler (in-thread fault mode):
    /// it makes only async-signal-safe system calls (`pread`), allocates
    /// nothing and takes no lock. Default false: faults on the store's
    /// regions are then handed to a resolver thread, where `read_at` may do
    /// anything.
    fn signal_safe(&self) -> bool {
        false
    }
    /// Whether a fork child may go on using this store object (the same
    /// descriptors, no state shared with the parent's threads, no
    /// connection whose protocol state the parent shares). The regions of
    /// a store that says so are mapped again in a fork child on the same
    /// store; the others are not inherited (docs/design.md, "fork").
    /// Default false.
    fn fork_safe(&self) -> bool {
        false
    }
    /// Whether write-back may hand this store part of a folio: one 4 KiB
    /// page inside it, at its own offset (a folio of 8 KiB-1 MiB dirty in
    /// part, dirty.rs). Default false: the store sees whole folios, or runs
    /// of them, only (a store of chunks, such as a Redis dataset, or a
    /// store that compresses whole folios).
    fn takes_pages(&self) -> bool {
        false
    }
    /// The smallest run of bytes this store reads and writes whole, a
    /// power of two of at least 4 KiB: a Redis dataset's chunk. A region
    /// of the store has folios of this size unless its options set a
    /// multiple of it ([`Pager::map_store`](crate::Pager::map_store)
    /// refuses others). Default 4 KiB.
    fn unit(&self) -> u64 {
        crate::config::MIN_FOLIO
    }
    /// The run of bytes a write-back covers without reading anything
    /// back: a write of less is a read-modify-write in the store (an S3
    /// dataset's group: a GET of the group, then its PUT). A multiple of
    /// [`Store::unit`]; the store's maps may choose it as their default
    /// folio (upager_s3). Default [`Store::unit`].
    fn write_unit(&self) -> u64 {
        self.unit()
    }
    /// A store that keeps warm-start traces with its data
    /// ([`MapOptions::warm`](crate::MapOptions::warm)) says which version
    /// of the data it holds: a number that changes when the data is
    /// replaced (a new upload), so a trace recorded on other data is not
    /// replayed. Default None: no traces (a file region's trace lives
    /// beside its file instead).
    fn trace_version(&self) -> Option<u64> {
        None
    }
    /// The identity of the store's bytes, for a page pool that the
    /// processes mapping them share (pool.rs): equal keys mean equal
    /// bytes. A file's is its device, inode, size and change times, so a
    /// file changed since a pool was made gets a pool of its own. Default
    /// None: the store's regions are private.
    fn pool_key(&self) -> Option<String> {
        None
    }
    /// The warm-start trace kept with the data, if any (stores with a
    /// [`Store::trace_version`]).
    fn load_trace(&self) -> io::Result<Option<Vec<u8>>> {
        Ok(None)
    }
    /// Keeps `trace` with the data, replacing any (stores with a
    /// [`Store::trace_version`]).
    fn save_trace(&self, _trace: &[u8]) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// A file (or a range of one) as a store: a regular file or a block
/// device (its size from seeking to its end). Other kinds are refused at
/// map time ([`FileKind`], [`unpageable`]).
///
/// The size is taken once, when the store is opened. A file truncated
/// under a mapping (by another program) has fewer bytes than the store
/// promises: a read that comes back short fails with `UnexpectedEof`
/// (never zeros for data the file had), so the access gets SIGBUS (a
/// system call EFAULT), and the store logs the new size once.
#[derive(Debug)]
pub struct FileStore {
    fds: Fds,
    len: u64,
    writable: bool,
    /// Write-back rings: its own, or its pager's once shared.
    rings: Arc<RingPool>,
    /// The path, for the truncation message.
    name: PathBuf,
    /// The truncation message was logged.
    shrink_logged: AtomicBool,
}

impl FileStore {
    /// Opens `path`; `direct` tries an extra O_DIRECT descriptor.
    pub fn open(path: &Path, writable: bool, direct: bool) -> io::Result<FileStore> {
        let buffered = OpenOptions::new().read(true).write(writable).open(path)?;
        let direct = if direct {
            OpenOptions::new()
                .read(true)
                .write(writable)
                .custom_flags(libc_o_direct())
                .open(path)
                .ok()
        } else {
            None
        };
        let len = file_len(&buffered)?;
        Ok(FileStore {
            fds: Fds::new(buffered, direct),
            len,
            writable,
            rings: Arc::default(),
            name: path.to_path_buf(),
            shrink_logged: AtomicBool::new(false),
        })
    }

    /// Wraps an open file; `writable` must match how it was opened;
    /// `direct` tries an extra O_DIRECT descriptor to the same file.
    pub fn from_file(file: File, writable: bool, direct: bool) -> io::Result<FileStore> {
        let len = file_len(&file)?;
        let direct = if direct {
            reopen_direct(&file, writable)
        } else {
            None
        };
        let name = PathBuf::from(format!(
            "<file descriptor {}>",
            std::os::fd::AsRawFd::as_raw_fd(&file)
        ));
        Ok(FileStore {
            fds: Fds::new(file, direct),
            len,
            writable,
            rings: Arc::default(),
            name,
            shrink_logged: AtomicBool::new(false),
        })
    }

    /// A read at `offset` got only `got` bytes, fewer than the store
    /// promised: the file was truncated under the mapping. Logs it once, outside the SIGBUS
    /// handler (an in-thread fault hands a failed read to a resolver
    /// thread, which reads again and gets here with logging allowed).
    fn shrunk(&self, offset: u64, got: usize) -> io::Error {
        if !upager_sys::signal::in_sigbus_handler()
            && !self.shrink_logged.swap(true, Ordering::Relaxed)
        {
            let now = file_len(&self.fds.buffered).map_or("?".to_string(), |n| n.to_string());
            log::error!(
                "{}: the file is {now} bytes now but was {} bytes when it was mapped (truncated under the mapping?): the read at byte {} got {got} bytes; accesses beyond the new end get SIGBUS (system calls EFAULT). Do not shrink a mapped file; unmap it first",
                self.name.display(),
                self.len,
                offset,
            );
        }
        // No message of its own: this may run in a signal handler.
        io::ErrorKind::UnexpectedEof.into()
    }

    /// The (buffered) descriptor.
    pub(crate) fn file(&self) -> &File {
        &self.fds.buffered
    }

    /// Whether aligned I/O goes through an `O_DIRECT` descriptor now:
    /// false if direct I/O was not asked for, the file system refused
    /// `O_DIRECT` at open, or refused an I/O since (see the module doc).
    pub fn direct_io(&self) -> bool {
        self.fds.direct().is_some()
    }
}

impl Drop for FileStore {
    fn drop(&mut self) {
        self.fds.report(|| self.describe());
    }
}

/// The size of an open file: its length, or for a block device (whose
/// `st_size` is 0) the offset of its end.
fn file_len(file: &File) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::FileTypeExt;
    let meta = file.metadata()?;
    if meta.file_type().is_block_device() {
        // The descriptor's offset is not used: the store reads and writes
        // at explicit offsets.
        let mut f = file;
        return f.seek(SeekFrom::End(0));
    }
    Ok(meta.len())
}

/// File systems whose regular files are made up by the kernel on each read
/// (their size says nothing about their content): proc, sysfs, debugfs, tracefs, cgroup, cgroup2,
/// configfs, securityfs (magic numbers of `include/uapi/linux/magic.h`).
const PSEUDO_FS: [i64; 8] = [
    0x9fa0,      // PROC_SUPER_MAGIC
    0x6265_6572, // SYSFS_MAGIC
    0x6462_6720, // DEBUGFS_MAGIC
    0x7472_6163, // TRACEFS_MAGIC
    0x0027_e0eb, // CGROUP_SUPER_MAGIC
    0x6367_7270, // CGROUP2_SUPER_MAGIC
    0x6265_6570, // CONFIGFS_MAGIC
    0x7363_6673, // SECURITYFS_MAGIC
];

/// Why a file cannot be a store, by its type (checked before it is opened:
/// opening a FIFO would block until a writer comes). Regular files and
/// block devices can; a pseudo-file is caught by [`unpageable_open`].
pub(crate) fn unpageable(meta: &std::fs::Metadata) -> Option<FileKind> {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        Some(FileKind::Directory)
    } else if t.is_fifo() {
        Some(FileKind::Fifo)
    } else if t.is_socket() {
        Some(FileKind::Socket)
    } else if t.is_char_device() {
        Some(FileKind::CharDevice)
    } else {
        None
    }
}

/// Why an open file cannot be a store: [`unpageable`], or a file of a
/// kernel pseudo file system (`/proc/self/status` has size 0 yet reads
/// return text; a sysfs attribute says 4096 and holds a few bytes).
pub(crate) fn unpageable_open(file: &File, meta: &std::fs::Metadata) -> Option<FileKind> {
    unpageable(meta).or_else(|| {
        let pseudo = meta.file_type().is_file()
            && upager_sys::io::fs_magic(file).is_ok_and(|m| PSEUDO_FS.contains(&m));
        pseudo.then_some(FileKind::PseudoFile)
    })
}

/// Why a file could not be opened to be read whole, as an upload's source
/// ([`open_regular_file`]).
#[derive(Debug, displaydoc::Display, thiserror::Error)]
pub enum OpenRegularError {
    /// cannot read {path}: {source} (nothing was uploaded)
    Io {
        /// The path given.
        path: PathBuf,
        /// Why it could not be examined or opened.
        source: io::Error,
    },
    /// {path} is a {kind}, not a regular file: upload a regular file (nothing was uploaded)
    NotRegular {
        /// The path given.
        path: PathBuf,
        /// What it is ("directory", "FIFO", "socket", "block device",
        /// "character device").
        kind: &'static str,
    },
}

/// Opens the file at `path` to be read whole, as an upload's source (the
/// Redis and S3 `load`s): a regular file, with its length. Anything else is
/// refused before it is opened (opening a FIFO waits for a writer; a
/// character device such as /dev/zero reads without end; a block device's
/// metadata says 0 bytes), and checked again once open (the path may have
/// been replaced in between).
pub fn open_regular_file(path: &Path) -> Result<(File, u64), OpenRegularError> {
    use std::os::unix::fs::FileTypeExt;
    let io = |source| OpenRegularError::Io {
        path: path.to_path_buf(),
        source,
    };
    let check = |t: std::fs::FileType| {
        let kind = if t.is_dir() {
            "directory"
        } else if t.is_fifo() {
            "FIFO"
        } else if t.is_socket() {
            "socket"
        } else if t.is_block_device() {
            "block device"
        } else if t.is_char_device() {
            "character device"
        } else {
            return Ok(());
        };
        Err(OpenRegularError::NotRegular {
            path: path.to_path_buf(),
            kind,
        })
    };
    check(std::fs::metadata(path).map_err(io)?.file_type())?;
    let file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    check(meta.file_type())?;
    Ok((file, meta.len()))
}

fn libc_o_direct() -> i32 {
    libc::O_DIRECT // 0o40000 on x86-64, 0o200000 on arm64: never typed by hand
}

/// Reads until `buf` is full or the file ends.
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        // O_DIRECT may stop at an unaligned EOF; the next read returns 0.
    }
    Ok(done)
}

/// What `/proc/self/fd` says an open file is: the path it was opened by
/// (with " (deleted)" after it once unlinked), or another name for what
/// has none (`pipe:[...]`).
fn fd_link(f: &File) -> Option<std::path::PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).ok()
}

/// The path of an open file (`/proc/self/fd`), for messages.
fn path_of(f: &File) -> String {
    fd_link(f).map_or_else(|| "(unknown path)".into(), |p| p.display().to_string())
}

/// The path an open file was opened by (`/proc/self/fd`), if that path
/// still names the same file (`meta`, the descriptor's metadata): not for
/// a deleted file or one another file was renamed over.
pub(crate) fn path_if_same(f: &File, meta: &std::fs::Metadata) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let path = fd_link(f)?;
    let now = std::fs::metadata(&path).ok()?;
    (path.is_absolute() && now.dev() == meta.dev() && now.ino() == meta.ino()).then_some(path)
}

impl Store for FileStore {
    fn len(&self) -> u64 {
        self.len
    }
    fn describe(&self) -> String {
        format!("file {}", path_of(&self.fds.buffered))
    }
    fn writable(&self) -> bool {
        self.writable
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = self.fds.read(buf, offset);
        self.fds.report(|| self.describe());
        let n = n?;
        let promised = (buf.len() as u64).min(self.len.saturating_sub(offset)) as usize;
        if n < promised {
            return Err(self.shrunk(offset, n));
        }
        Ok(promised)
    }
    fn write_from(&self, src: Src<'_>, offset: u64) -> io::Result<()> {
        let res = self.fds.write(src, offset);
        self.fds.report(|| self.describe());
        res
    }
    fn write_batch(&self, batch: &[Write<'_>]) -> Written {
        let done = write_together(&self.rings, &self.fds, batch);
        self.fds.report(|| self.describe());
        done
    }
    fn sync(&self) -> io::Result<()> {
        self.fds.report(|| self.describe());
        self.fds.buffered.sync_data()
    }
    fn signal_safe(&self) -> bool {
        true // pread into the caller's buffer
    }
    fn fork_safe(&self) -> bool {
        // Positional I/O on inherited descriptors (no file offset used);
        // rings made before a fork are never used by the child (RingPool),
        // and its lock is only tried.
        true
    }
    fn takes_pages(&self) -> bool {
        true // bytes at any offset
    }
    fn pool_key(&self) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        let m = self.fds.buffered.metadata().ok()?;
        m.is_file().then(|| {
            format!(
                "file {}:{} {} {}.{} {}.{}",
                m.dev(),
                m.ino(),
                m.size(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec()
            )
        })
    }
}

/// The private swap file of an anonymous region: created with mode 0600 and
/// unlinked before anyone else can open it; closing it frees its space.
#[derive(Debug)]
pub struct SwapFile {
    fds: Fds,
    /// Write-back rings: its own, or its pager's once shared.
    rings: Arc<RingPool>,
}

impl SwapFile {
    /// Creates an unnamed file in `dir` (O_TMPFILE, or create + unlink).
    pub fn create(dir: &Path, direct: bool) -> io::Result<SwapFile> {
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc_o_tmpfile())
            .open(dir)
        {
            Ok(f) => f,
            Err(_) => {
                let name = dir.join(format!(".upager-swap-{}-{}", std::process::id(), unique()));
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&name)?;
                std::fs::remove_file(&name)?;
                f
            }
        };
        // A second O_DIRECT descriptor on the same unnamed inode.
        let direct = if direct {
            reopen_direct(&file, true)
        } else {
            None
        };
        Ok(SwapFile {
            fds: Fds::new(file, direct),
            rings: Arc::default(),
        })
    }

    /// Whether aligned I/O goes through an `O_DIRECT` descriptor now (as
    /// [`FileStore::direct_io`]).
    pub fn direct_io(&self) -> bool {
        self.fds.direct().is_some()
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        self.fds.report(|| self.describe());
    }
}

/// An O_DIRECT descriptor to the same inode as `file` (through
/// /proc/self/fd), if the file system allows O_DIRECT.
fn reopen_direct(file: &File, writable: bool) -> Option<File> {
    OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(libc_o_direct())
        .open(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(file)
        ))
        .ok()
}

/// The call through the direct descriptor that a file system refused
/// (for the message).
#[derive(Debug, Clone, Copy)]
enum Refused {
    Read = 1,
    Write = 2,
    RingWrite = 3,
}

/// A store's descriptors to one file: the buffered one, and an `O_DIRECT`
/// one where the file system accepted the flag at open, used for aligned
/// I/O until the file system refuses an I/O on it (module doc, "O_DIRECT
/// refused after open"). Every method but [`Fds::report`] is
/// async-signal-safe.
#[derive(Debug)]
struct Fds {
    buffered: File,
    direct: Option<File>,
    /// 0 while the direct descriptor is in use; else why it is not any
    /// more: `(Refused as u32) << 16 | errno`, of the first refusal. Set
    /// once, never cleared.
    refused: AtomicU32,
    /// The refusal was logged (or is being logged, by one thread).
    logged: AtomicBool,
}

impl Fds {
    fn new(buffered: File, direct: Option<File>) -> Fds {
        Fds {
            buffered,
            direct,
            refused: AtomicU32::new(0),
            logged: AtomicBool::new(false),
        }
    }

    /// The direct descriptor, unless there is none or it was refused.
    fn direct(&self) -> Option<&File> {
        if self.refused.load(Ordering::Relaxed) != 0 {
            return None;
        }
        self.direct.as_ref()
    }

    /// The direct descriptor for `len` bytes at memory `addr` and file
    /// `offset`, if it may take them (all three page-aligned); None: the
    /// buffered one.
    fn pick(&self, addr: u64, len: usize, offset: u64) -> Option<&File> {
        let aligned = addr.is_multiple_of(PAGE_SIZE as u64)
            && len.is_multiple_of(PAGE_SIZE)
            && offset.is_multiple_of(PAGE_SIZE as u64);
        self.direct().filter(|_| aligned)
    }

    /// Whether `e`, the error of `call` through the direct descriptor, is
    /// the file system refusing direct I/O (EINVAL, EOPNOTSUPP); if so the
    /// direct descriptor is not used any more (the first refusal's reason
    /// is kept for the message).
    fn refuse(&self, e: &io::Error, call: Refused) -> bool {
        let Some(errno @ (libc::EINVAL | libc::EOPNOTSUPP)) = e.raw_os_error() else {
            return false;
        };
        let why = ((call as u32) << 16) | (errno as u32 & 0xffff);
        let _ = self
            .refused
            .compare_exchange(0, why, Ordering::Relaxed, Ordering::Relaxed);
        true
    }

    /// Reads into `buf` from `offset` until it is full or the file ends:
    /// through the direct descriptor if [`Fds::pick`] gives it, again
    /// through the buffered one if the file system refuses that.
    fn read(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if let Some(d) = self.pick(buf.as_ptr() as u64, buf.len(), offset) {
            match test_refusal().map_or_else(|| read_full(d, buf, offset), Err) {
                Err(e) if self.refuse(&e, Refused::Read) => {}
                res => return res,
            }
        }
        read_full(&self.buffered, buf, offset)
    }

    /// Writes all of `src` at `offset`, as [`Fds::read`] reads.
    fn write(&self, src: Src<'_>, offset: u64) -> io::Result<()> {
        match self.pick(src.addr(), src.len(), offset) {
            Some(d) => self.write_at(d, true, src, offset),
            None => src.write_to(&self.buffered, offset),
        }
    }

    /// Writes all of `src` at `offset` through `file` (`direct`: the
    /// direct descriptor); if the file system refuses the direct write,
    /// all of `src` again through the buffered descriptor (a part that
    /// landed is written over with the same bytes: the source is
    /// write-protected memory).
    fn write_at(&self, file: &File, direct: bool, src: Src<'_>, offset: u64) -> io::Result<()> {
        let res = match test_refusal().filter(|_| direct) {
            Some(e) => Err(e),
            None => src.write_to(file, offset),
        };
        match res {
            Err(e) if direct && self.refuse(&e, Refused::Write) => {
                src.write_to(&self.buffered, offset)
            }
            res => res,
        }
    }

    /// Logs a refusal once, naming the store (`what`, called only then)
    /// and the refused call. Not in a SIGBUS handler (no logging there):
    /// the store calls this after each I/O and when it closes, so a
    /// refusal met in a handler is logged by the next call outside one.
    fn report(&self, what: impl FnOnce() -> String) {
        let why = self.refused.load(Ordering::Relaxed);
        if why == 0
            || self.logged.load(Ordering::Relaxed)
            || upager_sys::signal::in_sigbus_handler()
            || self.logged.swap(true, Ordering::Relaxed)
        {
            return;
        }
        let call = match why >> 16 {
            1 => "read",
            2 => "write",
            _ => "write (io_uring)",
        };
        let err = io::Error::from_raw_os_error((why & 0xffff) as i32);
        log::warn!(
            "{}: the file system accepted O_DIRECT at open but refused an O_DIRECT {call} ({err}): \
             this store reads and writes through the page cache from now on (the kernel may keep \
             cached copies of its data outside the budget); a pager built with \
             `direct_io(false)` (Python `direct_io=False`) skips the attempt",
            what()
        );
    }
}

#[cfg(test)]
thread_local! {
    /// Unit tests: this thread's `pread`/`pwrite` on direct descriptors
    /// fail with EINVAL, as on LazyFS (io_uring writes are not affected).
    static REFUSE_DIRECT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The error a unit test makes direct I/O fail with; None outside tests.
#[inline]
fn test_refusal() -> Option<io::Error> {
    #[cfg(test)]
    if REFUSE_DIRECT.with(std::cell::Cell::get) {
        return Some(io::Error::from_raw_os_error(libc::EINVAL));
    }
    None
}

fn libc_o_tmpfile() -> i32 {
    libc::O_TMPFILE // includes O_DIRECTORY
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

impl Store for SwapFile {
    fn len(&self) -> u64 {
        u64::MAX
    }
    fn describe(&self) -> String {
        format!("swap file {}", path_of(&self.fds.buffered))
    }
    fn writable(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = self.fds.read(buf, offset);
        self.fds.report(|| self.describe());
        let n = n?;
        buf[n..].fill(0); // a slot past the file's end reads as zeros
        Ok(buf.len())
    }
    fn write_from(&self, src: Src<'_>, offset: u64) -> io::Result<()> {
        let res = self.fds.write(src, offset);
        self.fds.report(|| self.describe());
        res
    }
    fn write_batch(&self, batch: &[Write<'_>]) -> Written {
        let done = write_together(&self.rings, &self.fds, batch);
        self.fds.report(|| self.describe());
        done
    }
    fn sync(&self) -> io::Result<()> {
        self.fds.report(|| self.describe());
        Ok(()) // swap contents need not survive the process
    }
    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        upager_sys::io::punch_hole(&self.fds.buffered, offset, len)
    }
    fn signal_safe(&self) -> bool {
        true // pread into the caller's buffer
    }
}

/// Submission slots of a write-back ring: a batch of 1024 scattered folios
/// (the largest) takes 4 `io_uring_enter` calls. A guess, not measured
/// against other sizes: the enter is cheap next to 256 writes.
const RING_ENTRIES: u32 = 256;

/// Idle rings a pager keeps for reuse; more are closed when returned.
/// About the threads that write back at once (reclaimer, fault handlers,
/// a flushing application thread); a guess.
const IDLE_RINGS: usize = 4;

/// io_uring refused with EPERM/ENOSYS/EACCES somewhere in this process
/// (a sysctl or seccomp filter applies to all of it): write one by one.
static IO_URING_OFF: AtomicBool = AtomicBool::new(false);

/// The write-back rings of one pager's stores: taken by a batch, returned
/// after it. Every store of a pager holds the same pool (see
/// [`Shares`]), so the pager keeps at most [`IDLE_RINGS`] ring descriptors
/// however many files it maps, and closes them with its last store. Never
/// blocks (a busy lock means a fresh ring); rings made before a fork are
/// not used by the child (they are the parent's queues).
#[derive(Debug, Default)]
pub(crate) struct RingPool {
    idle: Mutex<Vec<(u32, WriteRing)>>,
}

impl RingPool {
    fn take(&self) -> Option<WriteRing> {
        if IO_URING_OFF.load(Ordering::Relaxed) {
            return None;
        }
        let pid = std::process::id();
        if let Ok(mut idle) = self.idle.try_lock() {
            idle.retain(|(p, _)| *p == pid);
            if let Some((_, r)) = idle.pop() {
                return Some(r);
            }
        }
        match WriteRing::new(RING_ENTRIES) {
            Ok(r) => Some(r),
            Err(e) => {
                // EINVAL: a kernel before 5.18, which does not know
                // IORING_SETUP_SUBMIT_ALL (before 5.18): pwrite there too.
                let off = matches!(
                    e.raw_os_error(),
                    Some(
                        libc::EPERM | libc::ENOSYS | libc::EACCES | libc::EOPNOTSUPP | libc::EINVAL
                    )
                );
                if off && !IO_URING_OFF.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "io_uring unavailable ({e}): write-back submits one pwrite per write"
                    );
                } else if !off {
                    log::debug!("no write-back ring ({e}): this batch writes one by one");
                }
                None
            }
        }
    }

    fn put(&self, ring: WriteRing) {
        if let Ok(mut idle) = self.idle.try_lock() {
            if idle.len() < IDLE_RINGS {
                idle.push((std::process::id(), ring));
            }
        }
    }
}

/// Writes a batch through one ring, all submitted together (see the module
/// doc), each write to the descriptor `fds` picks for it. A write the ring
/// could not submit, that completed short or was interrupted is finished
/// with `pwrite`; one the direct descriptor refused (EINVAL) is done again
/// whole through the buffered one ([`Fds::write`]). One by one when there
/// is no ring or one write.
fn write_together(rings: &RingPool, fds: &Fds, batch: &[Write<'_>]) -> Written {
    let one_by_one = |batch: &[Write<'_>]| {
        let results: Vec<_> = batch.iter().map(|w| fds.write(w.src, w.offset)).collect();
        Written::new(results, batch.len() as u64)
    };
    if batch.len() < 2 {
        return one_by_one(batch);
    }
    let Some(mut ring) = rings.take() else {
        return one_by_one(batch);
    };
    // Each write's descriptor, and whether it is the direct one.
    let files: Vec<(&File, bool)> = batch
        .iter()
        .map(|w| match fds.pick(w.src.addr(), w.src.len(), w.offset) {
            Some(d) => (d, true),
            None => (&fds.buffered, false),
        })
        .collect();
    let ops: Vec<WriteOp<'_>> = batch
        .iter()
        .zip(&files)
        .map(|(w, (f, _))| WriteOp {
            fd: std::os::fd::AsFd::as_fd(*f),
            addr: w.src.addr(),
            len: w.src.len() as u64,
            offset: w.offset,
        })
        .collect();
    let mut out: Vec<Option<io::Result<u64>>> = (0..batch.len()).map(|_| None).collect();
    let s = ring.write_all(&ops, &mut out);
    if s.stalled {
        log::warn!(
            "io_uring write-back of {} writes made no progress for {} s: cancelled, written with pwrite instead, and that ring dropped",
            batch.len(),
            upager_sys::uring::STALL.as_secs()
        );
    }
    if !s.broken {
        rings.put(ring);
    }
    let mut submissions = s.enters;
    let results = batch
        .iter()
        .zip(out)
        .zip(&files)
        .map(|((w, o), &(f, direct))| {
            let done = match o {
                Some(Ok(n)) if n as usize >= w.src.len() => return Ok(()),
                Some(Ok(n)) => n as usize,
                Some(Err(e)) if direct && fds.refuse(&e, Refused::RingWrite) => {
                    submissions += 1;
                    return w.src.write_to(&fds.buffered, w.offset);
                }
                Some(Err(e)) if !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) => {
                    return Err(e)
                }
                _ => 0,
            };
            submissions += 1;
            let rest = Src {
                map: w.src.map,
                off: w.src.off + done,
                len: w.src.len - done,
            };
            fds.write_at(f, direct, rest, w.offset + done as u64)
        })
        .collect();
    Written::new(results, submissions)
}

/// A swap file and its slots, held weakly.
type SwapSpace = (Weak<SwapFile>, Weak<Slots>);

/// The stores a pager's regions share: one per distinct file (device,
/// inode, writable; while its size is unchanged), and one swap file with one
/// slot allocator per folio size for anonymous regions. Held weakly: a store
/// closes with the last region using it.
#[derive(Default)]
pub(crate) struct Shares {
    files: Mutex<HashMap<(u64, u64, bool), Weak<FileStore>>>,
    swap: Mutex<HashMap<u64, SwapSpace>>,
    /// The write-back rings every store of the pager uses; held by the
    /// stores, so the rings close with the last of them.
    rings: Mutex<Weak<RingPool>>,
}

impl Shares {
    /// The store of a file some live region maps already, if its size is
    /// still the one the store knows (a read-only mapping may use a
    /// writable store).
    pub fn file(&self, meta: &std::fs::Metadata, writable: bool) -> Option<Arc<dyn Store>> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        let keys: &[bool] = if writable { &[true] } else { &[false, true] };
        keys.iter().find_map(|&w| {
            let st = files.get(&(meta.dev(), meta.ino(), w))?.upgrade()?;
            // A block device's st_size is 0: shared by identity alone.
            let same_len = st.len() == meta.len() || meta.file_type().is_block_device();
            same_len.then_some(st as Arc<dyn Store>)
        })
    }

    /// The pager's ring pool (a new one if no store holds it).
    fn rings(&self) -> Arc<RingPool> {
        let mut w = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        w.upgrade().unwrap_or_else(|| {
            let pool = Arc::<RingPool>::default();
            *w = Arc::downgrade(&pool);
            pool
        })
    }

    /// Records a newly opened file store for sharing (it takes the pager's
    /// write-back rings).
    pub fn add_file(
        &self,
        meta: &std::fs::Metadata,
        writable: bool,
        mut store: FileStore,
    ) -> Arc<dyn Store> {
        use std::os::unix::fs::MetadataExt;
        store.rings = self.rings();
        let store = Arc::new(store);
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        files.retain(|_, w| w.strong_count() > 0);
        files.insert((meta.dev(), meta.ino(), writable), Arc::downgrade(&store));
        store
    }

    /// The swap file and slots of anonymous regions with `folio`-sized
    /// folios, made by `create` for the first of them.
    pub fn swap(
        &self,
        folio: u64,
        create: impl FnOnce() -> io::Result<SwapFile>,
    ) -> io::Result<(Arc<dyn Store>, Arc<Slots>)> {
        let mut swap = self.swap.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((f, s)) = swap.get(&folio) {
            if let (Some(f), Some(s)) = (f.upgrade(), s.upgrade()) {
                return Ok((f, s));
            }
        }
        let mut file = create()?;
        file.rings = self.rings();
        let (file, slots) = (Arc::new(file), Arc::new(Slots::default()));
        swap.insert(folio, (Arc::downgrade(&file), Arc::downgrade(&slots)));
        Ok((file, slots))
    }
}

/// Allocator of swap slots (the store index reclaim updates, seed 003).
#[derive(Debug, Default)]
pub(crate) struct Slots {
    inner: Mutex<SlotsInner>,
}

#[derive(Debug, Default)]
struct SlotsInner {
    free: Vec<u32>,
    next: u32,
    /// Lock acquisitions, for the test that removal is batched.
    acquisitions: u64,
}

impl Slots {
    /// Hands out `n` slots. `batched`: one lock acquisition for all (seed
    /// 003); otherwise one per slot (the ablation).
    pub fn alloc(&self, n: usize, batched: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(n);
        let one = |g: &mut SlotsInner, out: &mut Vec<u32>| {
            let s = g.free.pop().unwrap_or_else(|| {
                g.next += 1;
                g.next - 1
            });
            out.push(s);
        };
        if batched {
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            g.acquisitions += 1;
            for _ in 0..n {
                one(&mut g, &mut out);
            }
        } else {
            for _ in 0..n {
                let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
                g.acquisitions += 1;
                one(&mut g, &mut out);
            }
        }
        out
    }

    /// Returns slots. A slot may be handed out again as soon as this
    /// returns: punch its space (if at all) before calling this.
    pub fn free(&self, slots: &[u32], batched: bool) {
        if slots.is_empty() {
            return;
        }
        if batched {
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            g.acquisitions += 1;
            g.free.extend_from_slice(slots);
        } else {
            for &s in slots {
                let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
                g.acquisitions += 1;
                g.free.push(s);
            }
        }
    }

    /// Lock acquisitions so far.
    pub fn acquisitions(&self) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .acquisitions
    }

    /// Slots in use.
    #[cfg(test)]
    pub fn in_use(&self) -> u64 {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        u64::from(g.next) - g.free.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_batch_under_one_lock() {
        let s = Slots::default();
        let a = s.alloc(64, true);
        assert_eq!(a.len(), 64);
        assert_eq!(s.acquisitions(), 1);
        s.free(&a[..10], true);
        assert_eq!(s.acquisitions(), 2);
        assert_eq!(s.in_use(), 54);
        let b = s.alloc(10, false);
        assert_eq!(s.acquisitions(), 12);
        let mut all: Vec<u32> = a[10..].iter().chain(&b).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 64, "no slot handed out twice");
    }

    /// A batch of scattered writes through a file store, with io_uring
    /// (a few submissions) and with it refused (one `pwrite` each, as
    /// where `kernel.io_uring_disabled` is set): the same bytes land.
    #[test]
    fn write_batch_submits_together_and_falls_back_to_one_write_each() {
        let map = Mapping::anonymous(64 * 4096, 4096, true).unwrap();
        for i in 0..64 {
            map.write_at(i * 4096, &[i as u8 + 1; 4096]);
        }
        let src = |i: usize| Src {
            map: &map,
            off: i * 4096,
            len: 4096,
        };
        for off in [false, true] {
            let f = tempfile::NamedTempFile::new().unwrap();
            let st = FileStore::open(f.path(), true, false).unwrap();
            // Every other page, backwards: no two writes are one run.
            let batch: Vec<Write<'_>> = (0..64)
                .map(|i| Write {
                    src: src(i),
                    offset: (127 - 2 * i as u64) * 4096,
                })
                .collect();
            IO_URING_OFF.store(off, Ordering::Relaxed);
            let done = st.write_batch(&batch);
            IO_URING_OFF.store(false, Ordering::Relaxed);
            assert!(done.results.iter().all(|r| r.is_ok()), "{:?}", done.results);
            if off {
                assert_eq!(done.submissions, 64, "one pwrite per write");
            } else if WriteRing::new(8).is_ok() {
                assert!(done.submissions <= 2, "{} submissions", done.submissions);
            }
            let data = std::fs::read(f.path()).unwrap();
            for i in 0..64 {
                let at = (127 - 2 * i) * 4096;
                assert!(data[at..at + 4096].iter().all(|&b| b == i as u8 + 1));
            }
        }
    }

    /// Runs `f` with this thread's direct `pread`/`pwrite` failing with
    /// EINVAL (LazyFS's behaviour), reset even if `f` panics.
    fn refusing<T>(f: impl FnOnce() -> T) -> T {
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                REFUSE_DIRECT.with(|c| c.set(false));
            }
        }
        REFUSE_DIRECT.with(|c| c.set(true));
        let _reset = Reset;
        f()
    }

    /// Issue 28 item 4, in the store alone: a refused direct read or write
    /// is done through the buffered descriptor, the data is right, the
    /// direct descriptor is not used again, and the reason is kept for one
    /// log message. (The real refusal, by a FUSE file system, and the
    /// message: tests/odirect.rs.)
    #[test]
    fn r28_4_a_refused_direct_read_or_write_falls_back_to_buffered() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("data");
        let pattern: Vec<u8> = (0..64 * 4096u32)
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        std::fs::write(&path, &pattern).unwrap();

        // Reads: a file store whose file system took O_DIRECT at open.
        let st = FileStore::open(&path, false, true).unwrap();
        if !st.direct_io() {
            eprintln!("skipping: /dev/shm refuses O_DIRECT at open (tmpfs before Linux 6.6)");
            return;
        }
        let mut buf = upager_sys::mem::AlignedBuf::zeroed(16 * 4096);
        let n = refusing(|| st.read_at(&mut buf, 8 * 4096)).unwrap();
        assert_eq!(n, 16 * 4096);
        assert_eq!(&buf[..], &pattern[8 * 4096..24 * 4096]);
        assert!(
            !st.direct_io(),
            "the direct descriptor is not used after a refusal"
        );
        let why = st.fds.refused.load(Ordering::Relaxed);
        assert_eq!(
            why,
            ((Refused::Read as u32) << 16) | libc::EINVAL as u32,
            "reason kept"
        );
        assert!(st.fds.logged.load(Ordering::Relaxed), "logged at once");
        // Later reads (no refusal now) are buffered and right.
        assert_eq!(st.read_at(&mut buf, 0).unwrap(), 16 * 4096);
        assert_eq!(&buf[..], &pattern[..16 * 4096]);

        // Writes: one by one, and a batch of one (the batch path's pwrite;
        // its io_uring path meets a real refusal in tests/odirect.rs).
        let map = Mapping::anonymous(8 * 4096, 4096, true).unwrap();
        for i in 0..8 {
            map.write_at(i * 4096, &[0xa0 + i as u8; 4096]);
        }
        let src = |i: usize, n: usize| Src {
            map: &map,
            off: i * 4096,
            len: n * 4096,
        };
        for batched in [false, true] {
            let st = FileStore::open(&path, true, true).unwrap();
            assert!(st.direct_io());
            let w = Write {
                src: src(0, 2),
                offset: 4 * 4096,
            };
            if batched {
                let done = refusing(|| st.write_batch(&[w]));
                assert!(done.results.iter().all(|r| r.is_ok()), "{:?}", done.results);
            } else {
                refusing(|| st.write_from(w.src, w.offset)).unwrap();
            }
            assert!(!st.direct_io());
            assert_eq!(
                st.fds.refused.load(Ordering::Relaxed) >> 16,
                Refused::Write as u32
            );
            // After the refusal a batch goes buffered (through a ring or not).
            let batch = [
                Write {
                    src: src(2, 1),
                    offset: 40 * 4096,
                },
                Write {
                    src: src(3, 5),
                    offset: 50 * 4096,
                },
            ];
            let done = st.write_batch(&batch);
            assert!(done.results.iter().all(|r| r.is_ok()), "{:?}", done.results);
            st.sync().unwrap();
        }
        let data = std::fs::read(&path).unwrap();
        let page = |p: usize| &data[p * 4096..(p + 1) * 4096];
        for (at, fill) in [(4, 0xa0), (5, 0xa1), (40, 0xa2), (50, 0xa3), (54, 0xa7)] {
            assert!(page(at).iter().all(|&b| b == fill), "page {at}");
        }
        assert_eq!(page(6), &pattern[6 * 4096..7 * 4096], "untouched");

        // The swap file: the same fallback.
        let sw = SwapFile::create(dir.path(), true).unwrap();
        if sw.direct_io() {
            refusing(|| sw.write_from(src(1, 1), 3 * 4096)).unwrap();
            assert!(!sw.direct_io());
            let mut b = upager_sys::mem::AlignedBuf::zeroed(4096);
            sw.read_at(&mut b, 3 * 4096).unwrap();
            assert!(b.iter().all(|&x| x == 0xa1));
        }
    }

    /// Errors that are not a refusal of direct I/O keep the direct
    /// descriptor (a bad descriptor, an I/O error).
    #[test]
    fn only_einval_and_eopnotsupp_disable_direct_io() {
        let f = tempfile::tempfile().unwrap();
        let fds = Fds::new(f, None);
        for errno in [libc::EIO, libc::ENOSPC, libc::EBADF, libc::EINTR] {
            let e = io::Error::from_raw_os_error(errno);
            assert!(!fds.refuse(&e, Refused::Read), "{e}");
        }
        assert_eq!(fds.refused.load(Ordering::Relaxed), 0);
        let e = io::Error::from_raw_os_error(libc::EOPNOTSUPP);
        assert!(fds.refuse(&e, Refused::RingWrite));
        let e = io::Error::from_raw_os_error(libc::EINVAL);
        assert!(fds.refuse(&e, Refused::Read));
        assert_eq!(
            fds.refused.load(Ordering::Relaxed),
            ((Refused::RingWrite as u32) << 16) | libc::EOPNOTSUPP as u32,
            "the first refusal is the one reported"
        );
    }

    #[test]
    fn swap_file_is_private_and_unnamed() {
        let dir = tempfile::tempdir().unwrap();
        let sw = SwapFile::create(dir.path(), true).unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "swap file must be unlinked"
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            sw.fds.buffered.metadata().unwrap().permissions().mode() & 0o777,
            0o600
        );
        let mut buf = upager_sys::mem::AlignedBuf::zeroed(8192);
        assert_eq!(sw.read_at(&mut buf, 1 << 30).unwrap(), 8192);
    }
}
