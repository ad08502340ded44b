//! Stores: where a region's data lives when it is not resident. This module
//! holds the [`Store`] trait and the types a store is handed ([`Src`],
//! [`Write`], [`Written`], [`ReadReq`]); the stores themselves live by
//! mechanism in their own modules:
//!
//! - `file_store`: [`FileStore`](crate::FileStore), an existing file (or a
//!   range of it), read-only or read-write;
//! - `swap`: [`SwapFile`](crate::SwapFile), the private swap file of an
//!   anonymous region, and its slot allocator;
//! - `direct`: the `O_DIRECT`/buffered descriptors both share, and their
//!   fallback when a file system refuses direct I/O after open;
//! - `rings`: the io_uring rings write-back submits a batch through;
//! - `shares`: the stores a pager's regions share.
//!
//! Anything implementing [`Store`] is a store (tests wrap a store to inject
//! faults). Write-back hands a store all the writes of one batch at once
//! ([`Store::write_batch`]); the default loops over [`Store::write_from`].
//!
//! Uses: `config`, `error` (in docs and defaults only).

use std::fs::File;
use std::io;

use upager_sys::mem::Mapping;

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
    /// The identity of the store's bytes for the disk tier (cache.rs), for
    /// a store whose every read is a trip over the network: equal keys mean
    /// equal bytes, for ever (an S3 object's endpoint, bucket, key, size
    /// and ETag), so a changed object is never served an old byte. Its
    /// read-only regions then keep what they fetch in the user's cache
    /// directory ([`PagerBuilder::cache_size`](crate::PagerBuilder::cache_size)).
    /// Default None: no disk tier.
    fn cache_key(&self) -> Option<String> {
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
