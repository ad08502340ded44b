//! The primitives of the lock-free core, in one place (crossbeam's
//! `primitive` module): `folio` takes its atomics and its spin-wait steps
//! from here, never from `std` directly, so the model checker can run the
//! real state-word code. Here they are `std`'s; `tests/model.rs` compiles
//! `folio.rs` into the test crate with a `sync` of its own whose atomics and
//! yields are shuttle's scheduling points (docs/reliability.md, "Model
//! checking the state word").

pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
pub(crate) use std::thread::{sleep, yield_now};
