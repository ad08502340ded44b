//! Errors across the C boundary: every failing call returns a negative errno
//! (or sets `errno`, on the UMap face) and leaves its full message, the
//! engine error's rendered chain, in a per-thread slot read by
//! `upager_last_error()`.
//!
//! Uses: none.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
use std::io;

thread_local! {
    /// Message of the last failed call on this thread (NUL-terminated).
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// A failed call: errno (positive) plus the message for `upager_last_error`.
#[derive(Debug)]
pub(crate) struct Failure {
    pub errno: c_int,
    pub msg: String,
}

impl Failure {
    pub fn new(errno: c_int, msg: impl Into<String>) -> Failure {
        Failure {
            errno,
            msg: msg.into(),
        }
    }
    pub fn inval(msg: impl Into<String>) -> Failure {
        Failure::new(libc::EINVAL, msg)
    }
    /// Records the message on this thread and returns `-errno`.
    pub fn record(self) -> c_int {
        set_last(&self.msg);
        -self.errno
    }
}

/// Stores `msg` as this thread's last error message.
pub(crate) fn set_last(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

/// Pointer to this thread's last message; valid until the next failing call
/// on this thread.
pub(crate) fn last_ptr() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// Every engine error carries its errno ([`engine::ErrorCode`], the same
/// mapping the Python face uses) and its message chain.
impl<E: engine::ErrorCode> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure::new(e.errno(), engine::error_chain(&e))
    }
}

/// Runs `f`, turning a panic into `-EIO` with a message instead of letting
/// it unwind into C (which would abort the process).
pub(crate) fn guard(f: impl FnOnce() -> Result<c_int, Failure>) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(fail)) => fail.record(),
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            Failure::new(
                libc::EIO,
                format!("internal error in upager (a bug; please report it): {what}"),
            )
            .record()
        }
    }
}

/// Text for an errno value, positive or negative (`strerror`'s wording,
/// owned by the Rust standard library's table, so it is thread-safe).
pub(crate) fn errno_text(err: c_int) -> String {
    let n = err.checked_abs().unwrap_or(0);
    if n == 0 {
        return "success".into();
    }
    let s = io::Error::from_raw_os_error(n).to_string();
    // "No such file or directory (os error 2)" -> "No such file or directory"
    match s.rfind(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// Checks a caller's struct `size` field against this library's: a struct
/// not initialised by its `_init()`, or built against another upager.h, is
/// refused (EINVAL). Shared by the native API and the callback stores.
pub(crate) fn checked_size(got: usize, want: usize, what: &str) -> Result<(), Failure> {
    if got == want {
        Ok(())
    } else {
        Err(Failure::inval(format!(
            "{what}.size is {got}, expected {want}: initialise the struct with {what}_init() (and build against the upager.h of this library version)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::{FlushError, MapError};

    #[test]
    fn errno_mapping_and_messages() {
        let f: Failure = MapError::ZeroSize.into();
        assert_eq!(f.errno, libc::EINVAL);
        assert_eq!(
            f.msg,
            "region size is 0: give a length of at least one byte"
        );
        let f: Failure = MapError::NotFound {
            path: "/nope".into(),
        }
        .into();
        assert_eq!(f.errno, libc::ENOENT);
        assert_eq!(f.record(), -libc::ENOENT);
        // SAFETY: last_ptr() points at this thread's NUL-terminated CString,
        // which no other call replaces while we read it.
        let msg = unsafe { std::ffi::CStr::from_ptr(last_ptr()) };
        assert_eq!(
            msg.to_str().unwrap(),
            "/nope: no such file (create it first, or map anonymous memory)"
        );
        assert_eq!(errno_text(-libc::ENOENT), "No such file or directory");
        assert_eq!(errno_text(0), "success");
        let f: Failure = FlushError::Writeback(io::Error::from_raw_os_error(libc::ENOSPC)).into();
        assert_eq!(f.errno, libc::ENOSPC);
    }

    #[test]
    fn panics_become_eio() {
        let r = guard(|| panic!("boom"));
        assert_eq!(r, -libc::EIO);
        // SAFETY: as above.
        let msg = unsafe { std::ffi::CStr::from_ptr(last_ptr()) };
        assert!(msg.to_str().unwrap().ends_with("boom"));
    }
}
