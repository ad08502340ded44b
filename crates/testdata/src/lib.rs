//! Test data for upager's tests, benchmarks, stress run and demo: data whose
//! every 8-byte word is known, so a pager that returns a wrong, stale or
//! zeroed word fails the run instead of looking fast.
//!
//! - [`word`]: pattern words — the value at each byte offset of a data set
//!   ([`mul_word`] for the engine tests, [`xor_word`] for the benchmarks,
//!   [`odd_word`] for the demo), the [`mix`] hash, and [`word_at`] to read a
//!   little-endian word out of bytes.
//! - [`rng`]: seeded generators whose sequences are pinned by tests:
//!   [`Rng`] (xorshift64\*, the demo's and the stress run's) and
//!   [`xorshift64`] (the benchmarks': the kernel's and upager's workloads
//!   draw the same offsets from it).
//! - [`file`]: writing a pattern file ([`write_file`], and
//!   [`write_file_with_progress`] for a progress bar) or a buffer
//!   ([`fill`]), and comparing a buffer ([`first_mismatch`]) or a whole file ([`verify_file`]) against
//!   a pattern, which answers with the first wrong word ([`Mismatch`]).
//!
//! A pattern is any `Fn(u64) -> u64` from a byte offset (a multiple of 8) to
//! the little-endian word stored there, so a check can also expect words a
//! workload rewrote:
//!
//! ```
//! use upager_testdata::{first_mismatch, mul_word, write_file, verify_file};
//!
//! let dir = std::env::temp_dir().join(format!("testdata-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = dir.join("data");
//! write_file(&path, 1 << 20, |off| mul_word(off, 7))?;
//! assert_eq!(verify_file(&path, |off| mul_word(off, 7))?, None);
//!
//! // Word 3 rewritten with its complement: the plain pattern now reports it.
//! let mut bytes = std::fs::read(&path)?;
//! bytes[24..32].copy_from_slice(&(!mul_word(24, 7)).to_le_bytes());
//! assert_eq!(first_mismatch(&bytes, 0, |off| mul_word(off, 7)).unwrap().offset, 24);
//! let rewritten = |off| if off == 24 { !mul_word(off, 7) } else { mul_word(off, 7) };
//! assert_eq!(first_mismatch(&bytes, 0, rewritten), None);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! The formulas are data: files made by one run are compared in later ones,
//! the benchmark figures in docs/benchmarks.md were measured on them, and
//! the demo's output counts words its generator chose. That is why three
//! word patterns and two generators live side by side, each pinned by a
//! test, instead of one of each: changing a formula changes the data.
//!
//! Only `std`, no `unsafe`.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod file;
pub mod rng;
pub mod word;

pub use file::{
    fill, first_mismatch, verify_file, verify_file_with_progress, write_file,
    write_file_with_progress, Mismatch,
};
pub use rng::{xorshift64, Rng};
pub use word::{mix, mul_word, odd_word, word_at, xor_word, GOLDEN};
