//! Stores of the program's own, from C: `struct upager_store_ops` (a
//! context pointer and read / write / sync / release callbacks), served to
//! the engine as a [`Store`].
//!
//! Contract with the callbacks (upager.h says the same to C programmers):
//! - they run on upager's threads (handler threads, the reclaimer, a
//!   resolver thread in the in-thread mode — never in a signal handler: the
//!   store says it is not signal-safe), several at once for different
//!   folios, so they must be thread-safe; they may block (a fault waits for
//!   its read; other folios' faults go on on other threads);
//! - `read` fills `len` bytes at `offset` and returns how many it read (a
//!   short read is asked again for the rest; 0 before the end of the store
//!   is an error) or a negative errno: the access that needed it gets
//!   SIGBUS (EFAULT in a system call), as with a file that cannot be read;
//! - `write` writes all `len` bytes or returns a negative errno: the folio
//!   stays dirty in memory and `upager_flush` reports the error;
//! - they must not touch the region's own memory that is not resident
//!   (that fault would wait for itself), nor throw (C++) or longjmp out;
//! - `release` is called once, when no region uses the store any more (also
//!   when the map call fails).
//!
//! Offsets are the store's own: the region's byte 0 is the store's
//! `upager_map_options.offset`.
//!
//! Uses: `error`.

use std::ffi::{c_int, c_void};
use std::io;

use engine::{Src, Store};

/// `struct upager_store_ops`: a store of callbacks; see upager.h.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct upager_store_ops {
    /// `sizeof(struct upager_store_ops)`, set by `upager_store_ops_init`.
    pub size: usize,
    /// Passed to every callback.
    pub ctx: *mut c_void,
    /// Bytes in the store.
    pub length: u64,
    /// Reads up to `len` bytes at `offset` into `buf`: bytes read, or a
    /// negative errno.
    pub read: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize, u64) -> i64>,
    /// Writes all `len` bytes of `buf` at `offset`: 0 or a negative errno.
    /// NULL: a read-only store.
    pub write: Option<unsafe extern "C" fn(*mut c_void, *const c_void, usize, u64) -> c_int>,
    /// Makes completed writes durable: 0 or a negative errno. NULL: nothing
    /// to do.
    pub sync: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
    /// Called once when upager no longer uses the store. NULL: nothing.
    pub release: Option<unsafe extern "C" fn(*mut c_void)>,
}

/// A [`Store`] of C callbacks.
#[derive(Debug)]
pub(crate) struct CallbackStore {
    ops: upager_store_ops,
}

// SAFETY: upager.h requires the callbacks to be thread-safe (they are called
// from several upager threads at once) and `ctx` to stay valid until
// `release`; the struct itself is a copy owned here.
unsafe impl Send for CallbackStore {}
// SAFETY: as for Send: concurrent calls are part of the callbacks' contract.
unsafe impl Sync for CallbackStore {}

impl CallbackStore {
    /// Takes a copy of `ops`; a store without `read` is refused.
    pub fn new(ops: upager_store_ops) -> Result<CallbackStore, crate::error::Failure> {
        if ops.read.is_none() {
            return Err(crate::error::Failure::inval(
                "upager_store_ops.read is NULL: a store must be readable",
            ));
        }
        Ok(CallbackStore { ops })
    }
}

fn errno_result(r: i64, what: &str) -> io::Result<u64> {
    if r >= 0 {
        return Ok(r as u64);
    }
    let e = io::Error::from_raw_os_error((-r).min(4095) as i32);
    Err(io::Error::new(
        e.kind(),
        format!("the program's store {what} callback failed: {e}"),
    ))
}

impl Store for CallbackStore {
    fn len(&self) -> u64 {
        self.ops.length
    }
    fn describe(&self) -> String {
        format!("the program's store callbacks ({} bytes)", self.ops.length)
    }
    fn writable(&self) -> bool {
        self.ops.write.is_some()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        // Never ask beyond the store's end: the callback may not check.
        let n = (buf.len() as u64).min(self.ops.length.saturating_sub(offset)) as usize;
        if n == 0 {
            return Ok(0);
        }
        let read = self.ops.read.expect("checked in new");
        // SAFETY: `buf` is valid for `n` writable bytes for the duration of
        // the call; the callback's contract (upager.h) is to write at most
        // `len` bytes there and return.
        let r = unsafe { read(self.ops.ctx, buf.as_mut_ptr().cast(), n, offset) };
        Ok(errno_result(r, "read")?.min(n as u64) as usize)
    }
    fn write_from(&self, src: Src<'_>, offset: u64) -> io::Result<()> {
        let Some(write) = self.ops.write else {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the program's store has no write callback",
            ));
        };
        // A private copy: the callback gets plain memory, never the
        // region's (which the program may be writing again meanwhile).
        let mut buf = vec![0u8; src.len()];
        src.copy_to(&mut buf);
        // SAFETY: `buf` is valid for `len` readable bytes during the call.
        let r = unsafe { write(self.ops.ctx, buf.as_ptr().cast(), buf.len(), offset) };
        errno_result(i64::from(r), "write").map(|_| ())
    }
    fn sync(&self) -> io::Result<()> {
        let Some(sync) = self.ops.sync else {
            return Ok(());
        };
        // SAFETY: the callback's contract: takes the context, returns.
        let r = unsafe { sync(self.ops.ctx) };
        errno_result(i64::from(r), "sync").map(|_| ())
    }
}

impl Drop for CallbackStore {
    fn drop(&mut self) {
        if let Some(release) = self.ops.release {
            // SAFETY: called once, when the engine dropped its last
            // reference: no other callback runs now or later.
            unsafe { release(self.ops.ctx) };
        }
    }
}

/// `upager_store_ops_init`: zeroes `o` and sets its `size`.
///
/// # Safety
/// `o` is NULL or valid for one write of the struct.
#[no_mangle]
pub unsafe extern "C" fn upager_store_ops_init(o: *mut upager_store_ops) {
    // SAFETY: NULL or valid by the contract above.
    if let Some(o) = unsafe { o.as_mut() } {
        *o = upager_store_ops {
            size: std::mem::size_of::<upager_store_ops>(),
            ctx: std::ptr::null_mut(),
            length: 0,
            read: None,
            write: None,
            sync: None,
            release: None,
        };
    }
}

/// Copies and checks `*ops` (the caller's pointer, NULL refused).
///
/// # Safety
/// `ops` is NULL or points to an initialised `upager_store_ops`.
pub(crate) unsafe fn store_from(
    ops: *const upager_store_ops,
) -> Result<CallbackStore, crate::error::Failure> {
    // SAFETY: NULL or valid by the contract above.
    let Some(o) = (unsafe { ops.as_ref() }) else {
        return Err(crate::error::Failure::inval(
            "the store ops pointer is NULL",
        ));
    };
    crate::error::checked_size(
        o.size,
        std::mem::size_of::<upager_store_ops>(),
        "upager_store_ops",
    )?;
    CallbackStore::new(*o)
}
