//! Environment variables (crates/upager/src/config.rs, crates/sys): the
//! sizes of `UMAP_*` and other size settings (`parse_size`; the UMap
//! drop-in reads a plain number, else a size), `UPAGER_FAULT_MODE`,
//! `UPAGER_USERFAULTFD`, `UPAGER_MASK_FEATURES`.
//!
//! Input: a selector byte, then the variable's value. Holds: a size that
//! parses is what the documented grammar says (a decimal number, optional
//! fraction, then an optional unit K, M, G, T with an optional `B` or
//! `iB`, or a plain `B`; case-insensitive; blanks around), its decimal
//! digits parse back to the same number, and a refused one gets an error
//! quoting it; a mode or choice that parses is its name (trimmed, any
//! case) and its name parses to it; a feature mask names known features.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "alloc_cap.rs"]
mod alloc_cap;
use upager::{parse_size, FaultMode, Userfaultfd};

/// The documented grammar, written apart from the parser: the number and
/// the unit's multiplier, or None.
fn grammar(s: &str) -> Option<(&str, u64)> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.as_str();
    let units: [(&str, u64); 13] = [
        ("kib", 1 << 10),
        ("kb", 1 << 10),
        ("k", 1 << 10),
        ("mib", 1 << 20),
        ("mb", 1 << 20),
        ("m", 1 << 20),
        ("gib", 1 << 30),
        ("gb", 1 << 30),
        ("g", 1 << 30),
        ("tib", 1 << 40),
        ("tb", 1 << 40),
        ("t", 1 << 40),
        ("b", 1),
    ];
    let (num, mult) = units
        .iter()
        .find_map(|(u, m)| t.strip_suffix(u).map(|n| (n, *m)))
        .unwrap_or((t, 1));
    let num = num.trim_end();
    let ok = !num.is_empty()
        && num.bytes().filter(|&b| b == b'.').count() <= 1
        && num.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && num.bytes().any(|b| b.is_ascii_digit());
    ok.then(|| (&s.trim()[..num.len()], mult))
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let Ok(v) = std::str::from_utf8(rest) else {
        return;
    };
    match sel % 4 {
        0 => match parse_size(v) {
            Ok(n) => {
                let Some((num, mult)) = grammar(v) else {
                    panic!("{v:?} is not a size as documented, yet parsed as {n}");
                };
                if let Ok(whole) = num.parse::<u64>() {
                    assert_eq!(Some(n), whole.checked_mul(mult), "{v:?}");
                }
                assert_eq!(parse_size(&n.to_string()), Ok(n));
            }
            Err(e) => assert!(e.contains("invalid size"), "{e}"),
        },
        1 => match v.parse::<FaultMode>() {
            Ok(m) => {
                assert!(v.trim().eq_ignore_ascii_case(m.name()));
                assert_eq!(m.name().parse::<FaultMode>(), Ok(m));
            }
            Err(e) => assert!(e.contains("unknown fault mode"), "{e}"),
        },
        2 => match v.parse::<Userfaultfd>() {
            Ok(c) => {
                assert!(v.trim().eq_ignore_ascii_case(c.name()));
                assert_eq!(c.name().parse::<Userfaultfd>(), Ok(c));
            }
            Err(e) => assert!(e.contains("unknown userfaultfd choice"), "{e}"),
        },
        _ => match upager_sys::features::parse_mask(v) {
            Ok(bits) => {
                let all = upager_sys::features::parse_mask("all").unwrap();
                assert_eq!(bits & !all, 0);
            }
            Err(e) => assert!(e.contains("unknown feature"), "{e}"),
        },
    }
});
