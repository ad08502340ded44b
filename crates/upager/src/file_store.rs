//! The file store: [`FileStore`], an existing file (or a range of it),
//! read-only or read-write, its I/O through the shared `O_DIRECT`/buffered
//! descriptors of `direct` and its write-back batches through the rings of
//! `rings`; and the checks of what a file must be to be a store
//! ([`unpageable`], [`unpageable_open`], [`open_regular_file`]).
//!
//! Uses: `direct`, `error`, `rings`, `store` (`swap` in tests).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::direct::{fd_link, libc_o_direct, path_of, reopen_direct, Fds};
use crate::error::FileKind;
use crate::rings::{write_together, RingPool};
use crate::store::{Src, Store, Write, Written};

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
    pub(crate) fds: Fds,
    len: u64,
    writable: bool,
    /// Write-back rings: its own, or its pager's once shared.
    pub(crate) rings: Arc<RingPool>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::direct::{Refused, REFUSE_DIRECT};
    use crate::rings::IO_URING_OFF;
    use crate::store::{Src, Write};
    use crate::swap::SwapFile;
    use upager_sys::mem::Mapping;
    use upager_sys::uring::WriteRing;

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
}
