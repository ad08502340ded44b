//! The compressed tier of anonymous regions (ztier.rs): values round-trip
//! through it under a small budget with many evictions in both fault
//! modes, incompressible data bypasses it, its pool stays inside the
//! budget, it shrinks into the swap file when full, and a discarded or
//! rewritten folio is never served an old copy; against a naive model.

// Integration tests sit at the top level of their file, which the workspace
// lint `tests_outside_test_module` (meant for src/) would flag.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::sync::atomic::Ordering::Relaxed;

use proptest::prelude::*;
use upager::{FaultMode, MapOptions, Pager, Region, Stats};

const MIB: u64 = 1 << 20;

fn pager(budget: u64, mode: FaultMode) -> Pager {
    upager::log_to_stderr();
    Pager::builder()
        .budget(budget)
        .fault_mode(mode)
        .build()
        .unwrap()
}

fn anon(p: &Pager, len: u64, tier: bool) -> Region {
    p.map_anonymous(len, &MapOptions::new().compressed_tier(tier))
        .unwrap()
}

/// splitmix64: incompressible words.
fn noise(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn budget_held(s: &Stats) {
    assert!(
        s.resident_peak_bytes <= s.budget_bytes,
        "resident (folios + pool) peaked above the budget: {s:?}"
    );
    assert!(
        s.ztier_pool_bytes <= s.budget_bytes / 2,
        "the pool took more than its share: {s:?}"
    );
}

#[test]
fn compressible_values_round_trip_through_the_tier_in_both_modes() {
    for mode in [FaultMode::Handlers, FaultMode::InThread] {
        let p = pager(8 * MIB, mode);
        let r = anon(&p, 64 * MIB, true);
        let w = r.words();
        for pass in 0..2u64 {
            for (i, x) in w.iter().enumerate() {
                x.store(i as u64 * 3 + pass, Relaxed);
            }
            for (i, x) in w.iter().enumerate() {
                assert_eq!(x.load(Relaxed), i as u64 * 3 + pass, "{mode:?} word {i}");
            }
        }
        let s = p.stats();
        eprintln!(
            "{mode:?}: {} evictions, {} stores, {} loads, {} rejects, pool {} B for {} folios",
            s.evictions,
            s.ztier_stores,
            s.ztier_loads,
            s.ztier_rejects,
            s.ztier_pool_bytes,
            s.ztier_folios
        );
        assert!(s.evictions > 1000, "{s:?}");
        assert!(s.ztier_stores > 500 && s.ztier_loads > 500, "{s:?}");
        assert_eq!(s.ztier_rejects, 0, "counters compress: {s:?}");
        assert!(s.ztier_saved_bytes > 32 * MIB, "{s:?}");
        assert!(s.ztier_compress_ns > 0 && s.ztier_decompress_ns > 0);
        if mode == FaultMode::InThread {
            assert!(s.faults_in_thread > 0, "{s:?}");
        }
        budget_held(&s);
    }
}

#[test]
fn incompressible_data_bypasses_the_tier() {
    let p = pager(8 * MIB, FaultMode::InThread);
    let r = anon(&p, 48 * MIB, true);
    let w = r.words();
    for (i, x) in w.iter().enumerate() {
        x.store(noise(i as u64 + 1), Relaxed);
    }
    for (i, x) in w.iter().enumerate() {
        assert_eq!(x.load(Relaxed), noise(i as u64 + 1), "word {i}");
    }
    let s = p.stats();
    assert!(s.evictions > 500, "{s:?}");
    assert!(s.ztier_rejects > 500, "{s:?}");
    assert_eq!(s.ztier_stores, 0, "{s:?}");
    assert_eq!(s.ztier_loads, 0, "{s:?}");
    assert!(s.writebacks > 500, "went to the swap file: {s:?}");
    budget_held(&s);
}

#[test]
fn the_tier_can_be_turned_off_per_region() {
    let p = pager(8 * MIB, FaultMode::Handlers);
    let r = anon(&p, 32 * MIB, false);
    for (i, w) in r.words().iter().enumerate() {
        w.store(i as u64, Relaxed);
    }
    for (i, w) in r.words().iter().enumerate() {
        assert_eq!(w.load(Relaxed), i as u64);
    }
    let s = p.stats();
    assert!(s.evictions > 100);
    assert_eq!(
        s.ztier_stores + s.ztier_rejects + s.ztier_pool_bytes,
        0,
        "{s:?}"
    );
}

/// Moderately compressible folios (half noise, half zeros) fill the pool
/// to its cap: it writes its oldest entries out to the swap file, and
/// every value still reads back.
#[test]
fn a_full_pool_writes_its_oldest_entries_to_the_swap_file() {
    for mode in [FaultMode::Handlers, FaultMode::InThread] {
        let p = pager(8 * MIB, mode);
        let r = anon(&p, 96 * MIB, true);
        let w = r.words();
        let val = |i: usize| {
            if (i / 512).is_multiple_of(2) {
                noise(i as u64 + 7)
            } else {
                0
            }
        };
        for (i, x) in w.iter().enumerate() {
            x.store(val(i), Relaxed);
        }
        for (i, x) in w.iter().enumerate() {
            assert_eq!(x.load(Relaxed), val(i), "{mode:?} word {i}");
        }
        let s = p.stats();
        eprintln!(
            "{mode:?}: {} stores, {} writebacks, {} loads, pool {} B",
            s.ztier_stores, s.ztier_writebacks, s.ztier_loads, s.ztier_pool_bytes
        );
        assert!(s.ztier_stores > 500, "{s:?}");
        assert!(s.ztier_writebacks > 100, "{s:?}");
        budget_held(&s);
    }
}

/// A discarded folio reads as zeros and a rewritten one as its new value,
/// never an older copy the pool held; a slot freed by a discard and taken
/// by another folio is served that folio's bytes.
#[test]
fn no_stale_copy_is_served_after_discard_or_rewrite() {
    let p = pager(4 * MIB, FaultMode::InThread);
    let r = anon(&p, 32 * MIB, true);
    let w = r.words();
    let folio_words = (r.folio_size() / 8) as usize;
    for (i, x) in w.iter().enumerate() {
        x.store(i as u64 + 1, Relaxed);
    }
    // Discard every other folio's worth of the first half.
    for f in (0..w.len() / folio_words / 2).step_by(2) {
        r.discard((f * folio_words * 8) as u64, r.folio_size())
            .unwrap();
    }
    // Rewrite the second half with incompressible data (goes to swap).
    for (i, x) in w.iter().enumerate().skip(w.len() / 2) {
        x.store(noise(i as u64 + 99), Relaxed);
    }
    for (i, x) in w.iter().enumerate() {
        let f = i / folio_words;
        let want = if i >= w.len() / 2 {
            noise(i as u64 + 99)
        } else if f.is_multiple_of(2) {
            0
        } else {
            i as u64 + 1
        };
        assert_eq!(x.load(Relaxed), want, "word {i}");
    }
    budget_held(&p.stats());
}

#[derive(Debug, Clone)]
enum Op {
    /// Write `val` (compressible if `small`) to every word of folio `f`.
    Fill { f: usize, val: u64, small: bool },
    /// Read folio `f` back and compare it with the model.
    Check { f: usize },
    /// Discard folio `f`.
    Discard { f: usize },
    /// Touch a long run of folios (forces evictions).
    Sweep { from: usize },
}

fn op(folios: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..folios, any::<u64>(), any::<bool>()).prop_map(|(f, val, small)| Op::Fill {
            f,
            val,
            small
        }),
        (0..folios).prop_map(|f| Op::Check { f }),
        (0..folios).prop_map(|f| Op::Discard { f }),
        (0..folios).prop_map(|from| Op::Sweep { from }),
    ]
}

const FOLIOS: usize = 256; // 16 MiB of 64 KiB folios, budget 4 MiB

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    /// The region against a naive model: a vector of folio contents.
    #[test]
    fn the_region_matches_a_naive_model(ops in prop::collection::vec(op(FOLIOS), 1..60), in_thread: bool) {
        let mode = if in_thread { FaultMode::InThread } else { FaultMode::Handlers };
        let p = pager(4 * MIB, mode);
        let r = anon(&p, FOLIOS as u64 * 65536, true);
        let fw = (r.folio_size() / 8) as usize;
        let w = r.words();
        let word = |val: u64, small: bool, i: usize| if small { val.wrapping_add(i as u64) } else { noise(val ^ i as u64) | 1 };
        // Model: per folio, None (zeros) or (val, small).
        let mut model: Vec<Option<(u64, bool)>> = vec![None; FOLIOS];
        for o in ops {
            match o {
                Op::Fill { f, val, small } => {
                    for i in 0..fw {
                        w[f * fw + i].store(word(val, small, i), Relaxed);
                    }
                    model[f] = Some((val, small));
                }
                Op::Check { f } => {
                    for i in 0..fw {
                        let want = model[f].map_or(0, |(v, s)| word(v, s, i));
                        prop_assert_eq!(w[f * fw + i].load(Relaxed), want, "folio {} word {}", f, i);
                    }
                }
                Op::Discard { f } => {
                    r.discard((f * fw * 8) as u64, r.folio_size()).unwrap();
                    model[f] = None;
                }
                Op::Sweep { from } => {
                    for f in (from..FOLIOS).chain(0..from).take(FOLIOS / 2) {
                        let want = model[f].map_or(0, |(v, s)| word(v, s, 0));
                        prop_assert_eq!(w[f * fw].load(Relaxed), want, "sweep folio {}", f);
                    }
                }
            }
        }
        for f in 0..FOLIOS {
            for i in (0..fw).step_by(61) {
                let want = model[f].map_or(0, |(v, s)| word(v, s, i));
                prop_assert_eq!(w[f * fw + i].load(Relaxed), want, "final folio {} word {}", f, i);
            }
        }
        let s = p.stats();
        prop_assert!(s.resident_peak_bytes <= s.budget_bytes);
    }
}

/// Unmapping the region returns the pool's charge to the budget; the
/// cumulative counters stay with the pager.
#[test]
fn unmapping_returns_the_pools_charge_and_keeps_the_counters() {
    let p = pager(8 * MIB, FaultMode::InThread);
    let r = anon(&p, 32 * MIB, true);
    for (i, w) in r.words().iter().enumerate() {
        w.store(i as u64, Relaxed);
    }
    let before = p.stats();
    assert!(
        before.ztier_pool_bytes > 0 && before.ztier_stores > 0,
        "{before:?}"
    );
    r.unmap().map_err(|(e, _)| e).unwrap();
    let s = p.stats();
    assert_eq!(
        s.ztier_pool_bytes + s.ztier_folios + s.ztier_bytes,
        0,
        "{s:?}"
    );
    assert_eq!(s.resident_bytes, 0, "the pool's charge came back: {s:?}");
    assert!(s.ztier_stores >= before.ztier_stores, "{s:?}");
}
