//! The process's SIGBUS handler for in-thread fault resolution.
//!
//! A userfaultfd opened with `UFFD_FEATURE_SIGBUS` makes a fault in a
//! registered range raise SIGBUS (`BUS_ADRERR`, `si_addr` = the address) in
//! the faulting thread instead of queueing a message. [`install_sigbus`]
//! installs one handler for the process (again if the program replaced it
//! since; the engine calls it for every in-thread region it maps) that
//! hands such a fault to the engine's resolver and returns, so the access
//! retries. Everything else goes on to the handler that was installed
//! before, or gets the default action:
//!
//! - another `si_code` (a poisoned page: `BUS_MCEERR_AR`; `kill -BUS`; a
//!   hardware error), or an address the resolver does not own (a file
//!   mapping beyond its end, another library's memory);
//! - the previous handler is called as it asked (`SA_SIGINFO` or not); if
//!   there was none (or it was `SIG_IGN`, which a fault cannot honour), the
//!   default action is restored and the handler returns: the access faults
//!   again and the process ends by SIGBUS, as it would without upager.
//!
//! The handler preserves `errno`, allocates nothing and takes no lock; the
//! resolver must keep to the same rules (see the engine's `inthread`
//! module). It runs on the thread's own stack (no `SA_ONSTACK`: the fill
//! path needs more than a small alternate stack) with `SA_NODEFER`, so a
//! fault taken while resolving one (inside a store read) is handled too.
//!
//! A program that installs its own SIGBUS handler after upager's must chain
//! to the one it replaced (as it would for any library that handles
//! signals, e.g. a JVM), or in-thread faults end its process until upager
//! installs its handler again (at the next map, on top of the program's,
//! which then gets the foreign signals).

use std::cell::Cell;
use std::io;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, OnceLock};

/// A SIGBUS raised by a memory access.
#[derive(Debug, Clone, Copy)]
pub struct BusFault {
    /// The faulting address (`si_addr`).
    pub addr: u64,
    /// Whether the access was a write, when the architecture tells
    /// (x86-64: the page-fault error code); None elsewhere.
    pub write: Option<bool>,
}

/// The engine's resolver: true if the fault was its own and the access may
/// retry; false passes the signal on. Must be async-signal-safe.
pub type Resolver = fn(&BusFault) -> bool;

static RESOLVER: OnceLock<Resolver> = OnceLock::new();
/// The disposition upager's handler replaced last (a leaked box: a
/// handler may be reading an older one, so none is ever freed; one per
/// (re)installation).
static PREVIOUS: AtomicPtr<Previous> = AtomicPtr::new(std::ptr::null_mut());
static INSTALL: Mutex<()> = Mutex::new(());

thread_local! {
    /// How deep this thread is in upager's SIGBUS handler (const-initialised,
    /// no destructor: safe to touch in the handler).
    static IN_HANDLER: Cell<u32> = const { Cell::new(0) };
}

/// Whether the calling thread runs inside upager's SIGBUS handler, where
/// only async-signal-safe calls are allowed (no logging, no allocation): a
/// store that wants to report something logs only when this is false.
pub fn in_sigbus_handler() -> bool {
    IN_HANDLER.with(Cell::get) > 0
}

/// Holds the installation lock (a fork `prepare` handler takes it so no
/// other thread holds it at the fork: a child that starts a pager installs
/// the handler again). Drop the guard in the parent and in the child, in
/// the child before any installation.
pub fn hold_install() -> std::sync::MutexGuard<'static, ()> {
    INSTALL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A saved `struct sigaction`.
struct Previous(libc::sigaction);

/// Installs upager's SIGBUS handler with `resolver`, or installs it again
/// if the program replaced it since (e.g. Python's `faulthandler.enable()`):
/// the replacing handler becomes the one foreign signals are passed to. A
/// call with a different resolver than the first is an error (one engine
/// per process).
pub fn install_sigbus(resolver: Resolver) -> io::Result<()> {
    let _g = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = RESOLVER.get() {
        if !std::ptr::fn_addr_eq(*r, resolver) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "another SIGBUS resolver is installed",
            ));
        }
        if sigbus_installed() {
            return Ok(());
        }
    }
    // SAFETY: zeroed sigaction structs are valid (no handler, empty mask).
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only reads the current one into `old`.
    if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) } != 0 {
        return Err(io::Error::last_os_error());
    }
    PREVIOUS.store(Box::into_raw(Box::new(Previous(old))), Ordering::Release);
    let _ = RESOLVER.set(resolver);
    // SAFETY: as above.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_sigbus as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_RESTART;
    // SAFETY: `sa.sa_mask` is a valid sigset_t to initialise.
    unsafe { libc::sigemptyset(&mut sa.sa_mask) };
    // SAFETY: `sa` is a fully initialised action whose handler has the
    // SA_SIGINFO signature. (The previous action was saved first, so a
    // foreign SIGBUS arriving from now on finds it.)
    if unsafe { libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether upager's handler is the process's SIGBUS handler now (a program
/// may have replaced it).
pub fn sigbus_installed() -> bool {
    // SAFETY: as in install_sigbus: a null new action only reads.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let ok = unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut cur) } == 0;
    ok && cur.sa_sigaction == on_sigbus as *const () as usize
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: errno is thread-local; its location is valid for the thread.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as u64) };
    IN_HANDLER.with(|d| d.set(d.get() + 1));
    let handled = code == libc::BUS_ADRERR
        && RESOLVER.get().is_some_and(|r| {
            r(&BusFault {
                addr,
                write: write_flag(ctx),
            })
        });
    IN_HANDLER.with(|d| d.set(d.get() - 1));
    if !handled {
        pass_on(sig, info, ctx);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Gives the signal to the handler upager replaced, or restores the
/// default action (the retried access then ends the process by SIGBUS).
fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let p = PREVIOUS.load(Ordering::Acquire);
    // SAFETY: non-null pointers in PREVIOUS come from Box::into_raw and are
    // never freed.
    let prev = (!p.is_null()).then(|| unsafe { (*p).0 });
    match prev {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the program installed this address as an
                // SA_SIGINFO handler; we call it as the kernel would.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: the program installed this address as a plain
                // `void (*)(int)` handler.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // SAFETY: a zeroed sigaction with SIG_DFL (0) is the default
            // action; sigaction is async-signal-safe.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            }
        }
    }
}

/// Whether the faulting access was a write, from the signal context.
#[cfg(target_arch = "x86_64")]
fn write_flag(ctx: *mut libc::c_void) -> Option<bool> {
    if ctx.is_null() {
        return None;
    }
    // SAFETY: for an SA_SIGINFO handler the third argument is the
    // interrupted thread's ucontext_t; REG_ERR holds the page-fault error
    // code, whose bit 1 is set for a write (measured: probes/wpsigbus.c).
    let err =
        unsafe { (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_ERR as usize] };
    Some(err & 2 != 0)
}

/// Elsewhere (arm64 keeps it in an ESR record of the signal frame): unknown;
/// the engine then fills for reading, and a write faults once more.
#[cfg(not(target_arch = "x86_64"))]
fn write_flag(_ctx: *mut libc::c_void) -> Option<bool> {
    None
}
