//! Pattern words: the 8-byte little-endian word a data set holds at each
//! byte offset (a multiple of 8), as a pure function of the offset and a
//! seed, so any word can be checked without keeping a copy of the data.
//!
//! | function | formula | used by |
//! |---|---|---|
//! | [`mul_word`] | `(offset ^ seed) * GOLDEN` | the engine's integration tests |
//! | [`xor_word`] | `offset ^ seed` | the benchmarks' data files |
//! | [`odd_word`] | `mul_word(offset, seed) \| 1` | `upager demo` |
//!
//! Each one differs between any two offsets of a file, so a word read from
//! the wrong place is caught, not only a zeroed or garbled one.

/// 2^64 / φ (the golden ratio), odd: multiplying by it is a bijection on
/// `u64` that spreads every input bit over the high bits (Fibonacci
/// hashing). Also the increment of splitmix64 ([`mix`]).
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The word at byte `offset` of a pattern made with `seed`:
/// `(offset ^ seed) * GOLDEN`. Neighbouring words differ in most of their
/// bits; zero only at `offset == seed`. The engine tests' pattern files
/// (`crates/upager/tests/common`).
pub fn mul_word(offset: u64, seed: u64) -> u64 {
    (offset ^ seed).wrapping_mul(GOLDEN)
}

/// The word at byte `offset` of a pattern made with `seed`: `offset ^ seed`.
/// The cheapest pattern to make and check, so a benchmark's scan measures
/// the pager, not the checking; the benchmarks' data files (`upager-bench`).
pub fn xor_word(offset: u64, seed: u64) -> u64 {
    offset ^ seed
}

/// [`mul_word`] with the lowest bit set: never zero, so a page the pager
/// lost (read back as zeros) can never pass for data; `upager demo`'s
/// dataset, whose rewritten words are the complement (even, so they never
/// equal a pattern word either).
pub fn odd_word(offset: u64, seed: u64) -> u64 {
    mul_word(offset, seed) | 1
}

/// The splitmix64 finaliser (Steele, Lea and Flood, "Fast splittable
/// pseudorandom number generators", OOPSLA 2014): a bijective hash whose
/// every output bit depends on every input bit. Seeds [`Rng::new`], and is
/// the hash of the stress run's records and checksums.
///
/// [`Rng::new`]: crate::Rng::new
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(GOLDEN);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The little-endian word at byte `off` of `bytes`.
///
/// # Panics
///
/// If `off + 8` is past the end of `bytes`.
pub fn word_at(bytes: &[u8], off: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[off..off + 8]);
    u64::from_le_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values made by the formulas before they moved here (files and
    /// figures depend on them): pinned.
    #[test]
    fn formulas_are_pinned() {
        assert_eq!(mul_word(8, 1), 0x8ff3_4785_799e_5cbd);
        assert_eq!(mul_word(4096, 42), 0x6cb5_9063_89f9_ab72);
        assert_eq!(mul_word(5, 5), 0);
        assert_eq!(xor_word(4096, 0xfeed), 4096 ^ 0xfeed);
        assert_eq!(odd_word(0, 0x5bd1_e995), 0xe4c4_13bc_a56e_5539);
        assert_eq!(odd_word(8000, 0x5bd1_e995), 0x43d0_ed93_405a_6b79);
        // splitmix64's published first output for state 0.
        assert_eq!(mix(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix(1), 0x910a_2dec_8902_5cc1);
        assert_eq!(mix(0xABCD), 0x7f40_74b4_6da0_3c6c);
    }

    #[test]
    fn patterns_tell_offsets_apart() {
        for seed in [0, 1, 0x5bd1_e995, u64::MAX] {
            let mut seen = std::collections::HashSet::new();
            for off in (0..1 << 16).step_by(8) {
                assert!(seen.insert(mul_word(off, seed)));
                assert_ne!(odd_word(off, seed), 0);
                assert_eq!(odd_word(off, seed) & !1, mul_word(off, seed) & !1);
                assert_ne!(xor_word(off, seed), xor_word(off + 8, seed));
            }
        }
    }

    #[test]
    fn word_at_reads_little_endian() {
        let b = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(word_at(&b, 0), 0x0706_0504_0302_0100);
        assert_eq!(word_at(&b, 2), 0x0908_0706_0504_0302);
    }

    #[test]
    #[should_panic]
    fn word_at_past_the_end_panics() {
        word_at(&[0; 8], 1);
    }
}
