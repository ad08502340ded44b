//! upager's C faces: `libupager.so` / `libupager.a`.
//!
//! - [`native`]: `include/upager.h`, the native API — pagers with a budget,
//!   regions over files (by path or descriptor) or anonymous memory, flush,
//!   unmap, counters by their stable names; negative errno plus a
//!   per-thread message on failure.
//! - [`umap`]: `include/umap/umap.h`, LLNL UMap's C API over one
//!   process-wide pager configured from UMap's environment variables, so a
//!   program written for UMap builds against upager by changing only the
//!   include path and `-lumap` (libumap.so is installed as another name of
//!   this library).
//! - [`store`]: stores of the program's own (`struct upager_store_ops`:
//!   read / write / sync callbacks), for `upager_map_store` and the UMap
//!   drop-in's C++ `Umap::umap_ex` / `Umap::Store` (header-only, in
//!   `umap/umap.h` and `umap/store/`).
//!
//! # unsafe
//! This crate is the C ABI boundary: its functions take raw pointers from C.
//! It is the workspace's second unsafe layer (the first is `upager-sys`),
//! and as thin: every `unsafe` block only turns a C pointer into a Rust
//! reference (or back) under the contract the header states, or sets
//! `errno`; each has a `// SAFETY:` comment. Everything else is the safe
//! engine API. No panic unwinds into C: each entry point runs under
//! [`error::guard`], which turns a panic into `-EIO`.
//!
//! The header files are hand-written (no bindgen/cbindgen step at build
//! time). The option structs carry their `size`, checked on every call, and
//! the C tests (`tests/c/`, run by `make test-c`) use every function.
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![allow(non_camel_case_types)]

// The C ABI boundary (see "unsafe" above): raw pointers from C.
#[allow(unsafe_code)]
mod error;
#[allow(unsafe_code)]
pub mod native;
#[allow(unsafe_code)]
pub mod store;
#[allow(unsafe_code)]
pub mod umap;
