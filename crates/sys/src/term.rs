//! Termination signals (SIGINT, SIGTERM, SIGHUP) taken synchronously: a
//! program that must clean up before it ends (the CLI demo removes its
//! dataset) blocks them in its first thread before it starts any other, so
//! every thread inherits the mask, and one thread waits for them with
//! `sigwait`. No signal handler runs: the clean-up is ordinary code on an
//! ordinary thread (it may allocate, lock and log).
//!
//! Child processes started with `std::process::Command` get an empty
//! signal mask (std resets it), so they can still be interrupted.
#![allow(unsafe_code)]

use std::io;

/// The signals [`TermSignals`] takes.
pub const TERM_SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// SIGINT, SIGTERM and SIGHUP, blocked in the thread that made this (and in
/// every thread it starts afterwards).
#[derive(Clone, Copy)]
pub struct TermSignals {
    set: libc::sigset_t,
}

impl std::fmt::Debug for TermSignals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TermSignals(SIGINT, SIGTERM, SIGHUP)")
    }
}

impl TermSignals {
    /// Blocks the termination signals in the calling thread. Call it before
    /// any other thread starts (threads started before keep them unblocked,
    /// and the kernel may deliver the signal there, with its default
    /// action).
    pub fn block() -> io::Result<TermSignals> {
        // SAFETY: a zeroed sigset_t is valid storage for sigemptyset.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a live sigset_t; sigemptyset/sigaddset only
        // write into it (valid signal numbers).
        unsafe {
            libc::sigemptyset(&mut set);
            for s in TERM_SIGNALS {
                libc::sigaddset(&mut set, s);
            }
        }
        // SAFETY: `set` is initialised; the old mask is not asked for.
        let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(TermSignals { set })
    }

    /// Waits until one of the signals is pending and takes it; returns its
    /// number.
    pub fn wait(&self) -> io::Result<i32> {
        let mut sig: libc::c_int = 0;
        // SAFETY: `self.set` is an initialised sigset_t and `sig` a live
        // int for sigwait to write.
        let r = unsafe { libc::sigwait(&self.set, &mut sig) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(sig)
    }
}

/// The name of signal `sig` ("SIGINT"), or its number.
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        n => format!("signal {n}"),
    }
}
