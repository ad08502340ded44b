//! Seeded random number generators: small, fast, and replayable — a run
//! with the same seed draws the same numbers, so a failure can be rerun and
//! a verifier can replay what a workload chose instead of recording it.
//!
//! Two algorithms, because both sequences are data (see the crate docs):
//!
//! - [`Rng`]: xorshift64\* (Vigna, "An experimental exploration of
//!   Marsaglia's xorshift generators, scrambled", 2016; shifts 12, 25, 27
//!   and a multiply). The default: the demo's random reads and writes and
//!   the stress run's every choice.
//! - [`xorshift64`]: Marsaglia's xorshift64 (shifts 13, 7, 17) on a bare
//!   `u64` state, unscrambled. The benchmarks' random workloads: the kernel
//!   and upager draw the same offsets from it, and the published figures
//!   were measured with it.
//!
//! Neither is for cryptography, and neither may start from state 0 (it
//! would stay 0).

use crate::word::mix;

/// xorshift64\*: a seeded generator of 64-bit numbers, one per thread.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with any `seed` (0 included): the state is
    /// `mix(seed) | 1`, so nearby seeds give unrelated sequences. The
    /// stress run's generators.
    pub fn new(seed: u64) -> Rng {
        Rng(mix(seed) | 1)
    }

    /// A generator whose state is `state` as given (not mixed); `state`
    /// must not be 0. `upager demo` seeds its threads this way
    /// (`0x1234_5678 + thread` for reads, `0x9abc_def0 + thread` for writes)
    /// and replays the write sequences to know which words changed.
    pub const fn from_state(state: u64) -> Rng {
        assert!(state != 0, "xorshift64* stays 0 from state 0");
        Rng(state)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n > 0`), by remainder: biased by at most
    /// `n / 2^64`, which no test here can see.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `per_million / 1e6`.
    pub fn chance(&mut self, per_million: u64) -> bool {
        self.below(1_000_000) < per_million
    }
}

/// One step of Marsaglia's xorshift64 (13, 7, 17): advances `state` and
/// returns it. `state` must not start at 0. The benchmarks' generator;
/// their threads start from `GOLDEN ^ ((thread + 1) << 32) ^ seed` (random
/// reads) or a small constant plus the thread number (the mixed workload).
pub fn xorshift64(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kernel and upager workloads must draw the same offsets, and the
    /// benchmarks' figures were measured on this sequence: pinned.
    #[test]
    fn xorshift64_sequence_is_pinned() {
        let mut s = 1u64;
        assert_eq!(
            [xorshift64(&mut s), xorshift64(&mut s), xorshift64(&mut s)],
            [1082269761, 1152992998833853505, 11177516664432764457]
        );
    }

    /// The demo replays its writers' sequences and reports how many words
    /// they rewrote; the stress run is replayable by seed: pinned.
    #[test]
    fn rng_sequences_are_pinned() {
        let mut r = Rng::from_state(0x1234_5678);
        assert_eq!(
            [r.next_u64(), r.next_u64(), r.next_u64()],
            [
                0x17e8_d604_eb05_44b0,
                0xafce_fb45_056c_64fe,
                0xabae_4d63_f218_1e16
            ]
        );
        let mut r = Rng::new(0x5EED);
        assert_eq!(
            [r.next_u64(), r.next_u64(), r.next_u64()],
            [
                0xdaf9_6ad8_cbe9_7e7f,
                0xa787_0504_fc8c_1bee,
                0x411e_09d1_3dc7_52c2
            ]
        );
    }

    #[test]
    fn same_seed_same_sequence_and_zero_seed_works() {
        let (mut a, mut b) = (Rng::new(0), Rng::new(0));
        for _ in 0..1000 {
            let x = a.next_u64();
            assert_ne!(x, 0);
            assert_eq!(x, b.next_u64());
        }
    }

    #[test]
    fn below_and_chance_stay_in_range() {
        let mut r = Rng::new(3);
        let mut hits = 0;
        for _ in 0..100_000 {
            assert!(r.below(7) < 7);
            hits += u32::from(r.chance(250_000));
        }
        // 25% of 100,000, within a margin no fair generator misses.
        assert!((23_000..27_000).contains(&hits), "{hits}");
        assert!(!Rng::new(4).chance(0));
        assert!(Rng::new(4).chance(1_000_000));
    }

    #[test]
    #[should_panic(expected = "state 0")]
    fn zero_state_is_refused() {
        let _ = Rng::from_state(std::hint::black_box(0));
    }
}
