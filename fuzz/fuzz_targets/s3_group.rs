//! S3 dataset group objects on the write-back path
//! (crates/s3/src/dataset.rs, `patch_group`): a group is read whole (its
//! GET body: outside bytes), the batch's writes laid over it, and PUT.
//!
//! Input: the group's length, what the GET returned (nothing: the group
//! does not exist; or a body of any length), writes inside the group.
//! Holds: the new group is exactly `glen` bytes; every byte a write
//! covers is that write's (the last one's), every other byte is the
//! body's (zero if the group does not exist); a body that is not the
//! group's length is refused (an error for the write-back), never
//! zero-filled or cut: that would overwrite the group's other bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "alloc_cap.rs"]
mod alloc_cap;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let glen = usize::from(u16::from_le_bytes([data[0], data[1]]) % 4096);
    let kind = data[2];
    let mut rest = &data[3..];
    let take = |rest: &mut &[u8], n: usize| -> Vec<u8> {
        let n = n.min(rest.len());
        let (a, b) = rest.split_at(n);
        *rest = b;
        a.to_vec()
    };
    // The body: none, exactly glen bytes, or some other length.
    let body: Option<Vec<u8>> = match kind % 3 {
        0 => None,
        1 => {
            let mut b = take(&mut rest, glen);
            b.resize(glen, 0xa5);
            Some(b)
        }
        _ => {
            let n = if rest.is_empty() {
                0
            } else {
                usize::from(rest[0]) * 17
            };
            Some(take(&mut rest, n))
        }
    };
    // Writes: (offset, length) pairs inside the group, bytes from the input.
    let mut writes: Vec<(usize, Vec<u8>)> = Vec::new();
    while rest.len() >= 4 && glen > 0 && writes.len() < 16 {
        let at = usize::from(u16::from_le_bytes([rest[0], rest[1]])) % glen;
        let n = usize::from(u16::from_le_bytes([rest[2], rest[3]])) % (glen - at + 1);
        rest = &rest[4..];
        let mut b = take(&mut rest, n);
        b.resize(n, 0x5a);
        writes.push((at, b));
    }
    let ws: Vec<(usize, &[u8])> = writes.iter().map(|(a, b)| (*a, b.as_slice())).collect();
    let got = upager_s3::dataset::patch_group_for_fuzz(body.as_deref(), glen, &ws);
    let wrong_len = matches!(&body, Some(b) if b.len() != glen);
    match got {
        Ok(out) => {
            assert!(
                !wrong_len,
                "a body of {:?} bytes for a group of {glen} was used",
                body.map(|b| b.len())
            );
            assert_eq!(out.len(), glen);
            let mut want = body.unwrap_or_else(|| vec![0; glen]);
            for (at, b) in &writes {
                want[*at..*at + b.len()].copy_from_slice(b);
            }
            assert!(out == want, "patched group differs");
        }
        Err(e) => {
            assert!(wrong_len, "refused a well-formed base: {e}");
            assert!(!e.is_empty());
        }
    }
});
