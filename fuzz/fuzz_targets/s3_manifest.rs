//! S3 dataset manifests (crates/s3/src/dataset.rs, `Manifest::parse`):
//! the object `NAME/manifest`, read as UTF-8 text as the store does.
//!
//! Holds: a manifest that parses has a group size the store accepts (a
//! power of two, 64 KiB-64 MiB: `GROUP_RANGE`), every group it implies
//! has 1..=group bytes (no read past the dataset's end), and it encodes to
//! text that parses to the same manifest. Anything else is refused with a
//! detail for `DatasetError::Manifest`.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "alloc_cap.rs"]
mod alloc_cap;
use upager_s3::dataset::{Manifest, GROUP_RANGE};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return; // the store refuses it before parsing (from_utf8)
    };
    match Manifest::parse_for_fuzz(text) {
        Ok(m) => {
            assert!(m.group.is_power_of_two() && GROUP_RANGE.contains(&m.group));
            let groups = m.len.div_ceil(m.group);
            if groups > 0 {
                let last = m.len - (groups - 1) * m.group;
                assert!(last >= 1 && last <= m.group, "last group of {last} bytes");
            }
            let again = m.encode_for_fuzz();
            assert_eq!(
                Manifest::parse_for_fuzz(&again),
                Ok(m),
                "round trip of {again:?}"
            );
        }
        Err(detail) => assert!(!detail.is_empty()),
    }
});
