//! Redis dataset metadata (crates/redis/src/store.rs, `parse_meta`): the
//! fields `len` and `chunk` of `upager:{NAME}:meta` as HMGET returns them.
//!
//! Input: a flag byte (which fields exist), then the two fields' bytes
//! separated by 0xff (decoded as the client does: a field that is not
//! UTF-8 fails the HMGET's conversion before this parser, so those are
//! skipped). Holds: metadata that parses has a chunk size the store
//! accepts (a power of two, 4 KiB-2 MiB), every chunk it implies has
//! 1..=chunk bytes (the store checks each chunk's length against it), and
//! the numbers printed parse to the same; a missing hash is `None`; a
//! half or foreign one is `OpenError::BadMeta` naming the dataset.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "alloc_cap.rs"]
mod alloc_cap;
use upager_redis::OpenError;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut parts = rest.splitn(2, |&b| b == 0xff);
    let (l, c) = (parts.next().unwrap_or(&[]), parts.next().unwrap_or(&[]));
    let (Ok(l), Ok(c)) = (std::str::from_utf8(l), std::str::from_utf8(c)) else {
        return;
    };
    let meta = [
        (flags & 1 != 0).then(|| l.to_string()),
        (flags & 2 != 0).then(|| c.to_string()),
    ];
    match upager_redis::store::parse_meta_for_fuzz("fuzz", &meta) {
        Ok(None) => assert!(meta.iter().all(Option::is_none)),
        Ok(Some((len, chunk))) => {
            assert!(chunk.is_power_of_two() && (4096..=2 << 20).contains(&chunk));
            let chunks = len.div_ceil(chunk);
            if chunks > 0 {
                let last = len - (chunks - 1) * chunk;
                assert!(last >= 1 && last <= chunk);
            }
            let printed = [Some(len.to_string()), Some(chunk.to_string())];
            assert_eq!(
                upager_redis::store::parse_meta_for_fuzz("fuzz", &printed)
                    .ok()
                    .flatten(),
                Some((len, chunk))
            );
        }
        Err(OpenError::BadMeta { name, detail }) => {
            assert_eq!(name, "fuzz");
            assert!(!detail.is_empty());
            assert!(meta.iter().any(Option::is_some));
        }
        Err(e) => panic!("not the documented error: {e}"),
    }
});
