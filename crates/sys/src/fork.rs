//! Fork handlers: `pthread_atfork(3)`.
//!
//! The engine registers one set of handlers per process: `prepare` runs in
//! the forking thread before the fork (the engine's threads still run),
//! `parent` in the parent after it, `child` in the child, where the forking
//! thread is the only thread, before `fork()` returns to the caller there.
//! Handlers registered by the C library itself run around them: glibc takes
//! its malloc locks after every `prepare` handler and has reset them before
//! any `child` handler, so all three may allocate.
#![allow(unsafe_code)]

use std::io;

/// A fork handler: a plain function, no argument. It must not unwind (a
/// panic would cross the C library's frames): catch it inside.
pub type Handler = extern "C" fn();

/// Registers `prepare`, `parent` and `child` with `pthread_atfork`. Each
/// call adds handlers (they are never removed): call it once per process.
pub fn at_fork(prepare: Handler, parent: Handler, child: Handler) -> io::Result<()> {
    // SAFETY: the three are `extern "C" fn()` items that live as long as
    // the program (function items are never unloaded with the engine
    // linked in); pthread_atfork only stores the pointers.
    let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    static PREPARED: AtomicU32 = AtomicU32::new(0);
    static IN_PARENT: AtomicU32 = AtomicU32::new(0);
    static IN_CHILD: AtomicU32 = AtomicU32::new(0);
    extern "C" fn prepare() {
        PREPARED.fetch_add(1, Ordering::SeqCst);
    }
    extern "C" fn parent() {
        IN_PARENT.fetch_add(1, Ordering::SeqCst);
    }
    extern "C" fn child() {
        IN_CHILD.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn handlers_run_around_a_fork() {
        at_fork(prepare, parent, child).unwrap();
        // SAFETY: the child only reads an atomic and calls _exit
        // (async-signal-safe); the parent waits for it.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let ok = IN_CHILD.load(Ordering::SeqCst) == 1 && IN_PARENT.load(Ordering::SeqCst) == 0;
            // SAFETY: ends the forked child at once.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above; `status` is a live int.
        // The child only runs two loads: it ends at once.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        assert_eq!(PREPARED.load(Ordering::SeqCst), 1);
        assert_eq!(IN_PARENT.load(Ordering::SeqCst), 1);
        assert_eq!(IN_CHILD.load(Ordering::SeqCst), 0);
    }
}
