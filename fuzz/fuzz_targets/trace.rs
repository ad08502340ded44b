//! Warm-start trace files (crates/upager/src/warm.rs, `decode`): the bytes
//! of `<file>.upager-trace`, or of a store's trace key.
//!
//! Holds: a trace that decodes names only folios inside its region (an
//! index past `len / folio` would make replay read outside the file), its
//! time marks never go back, its entries are no more than its bytes (no
//! input makes the decoder allocate more than the input justifies), and
//! it encodes to bytes that decode to the same trace, no longer than the
//! input. Anything else is refused (None: "not a trace (damaged?)").
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "alloc_cap.rs"]
mod alloc_cap;

fuzz_target!(|data: &[u8]| {
    // The bytes as they are (a damaged trace: refused at its checksum),
    // and sealed with a right checksum, so the decoder behind it is fuzzed.
    check(data);
    check(&upager::seal_trace_for_fuzz(data));
});

fn check(data: &[u8]) {
    let Some((words, order, marks)) = upager::decode_trace_for_fuzz(data) else {
        return;
    };
    let [folio, _offset, len, ..] = words;
    let nfolios = len.div_ceil(folio.max(1));
    for &i in &order {
        assert!(
            (i as u64) < nfolios,
            "folio {i} is outside the region's {nfolios} folios"
        );
    }
    assert!(marks.windows(2).all(|w| w[0] <= w[1]), "marks go back");
    assert!(
        order.len() + marks.len() <= data.len(),
        "more entries than bytes"
    );
    let again = upager::encode_trace_for_fuzz(words, order.clone(), marks.clone());
    assert!(again.len() <= data.len(), "re-encoded trace is longer");
    assert_eq!(
        upager::decode_trace_for_fuzz(&again),
        Some((words, order, marks)),
        "round trip"
    );
}
