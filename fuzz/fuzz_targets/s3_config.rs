//! The AWS config and credentials files (crates/s3/src/config.rs,
//! `parse_ini`): `~/.aws/config`, `~/.aws/credentials`, or the files
//! AWS_CONFIG_FILE / AWS_SHARED_CREDENTIALS_FILE name.
//!
//! Holds: what parses is sections of non-empty, lower-case keys without
//! '=' (an empty value only inside a sub-section), and writing it back out
//! (`[section]`, then `key = value` lines) parses to the same; what is
//! refused gets a line number inside the text and a reason.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "alloc_cap.rs"]
mod alloc_cap;
use upager_s3::config::parse_ini;

/// Whether `k` can be written as the key of a `k =` line: not blank at
/// its ends, and not starting as a comment or a section line does.
fn key_line(k: &str) -> bool {
    !k.is_empty() && k.trim() == k && !k.starts_with(['#', ';', '['])
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_ini(text) {
        Ok(ini) => {
            // Written back: `[section]`, then `key = value`; a key with an
            // empty value can only come from a sub-section (an empty value
            // at the top opens one), so it is written as one: `PREFIX =`,
            // then `  REST =` indented.
            let mut out = String::new();
            let mut names: Vec<_> = ini.keys().collect();
            names.sort();
            for name in names {
                assert!(!name.is_empty());
                out.push_str(&format!("[{name}]\n"));
                let sec = &ini[name];
                let mut keys: Vec<_> = sec.keys().collect();
                keys.sort();
                for k in keys {
                    assert!(!k.is_empty() && !k.contains('='), "key {k:?}");
                    assert_eq!(k.to_ascii_lowercase(), **k);
                    let v = &sec[k];
                    if v.is_empty() {
                        let (sub, rest) = k
                            .match_indices('.')
                            .map(|(i, _)| (&k[..i], &k[i + 1..]))
                            .find(|(a, b)| [a, b].iter().all(|p| key_line(p)))
                            .unwrap_or_else(|| panic!("{text:?}: key {k:?} with no value"));
                        out.push_str(&format!("{sub} =\n  {rest} =\n"));
                    } else {
                        out.push_str(&format!("{k} = {v}\n"));
                    }
                }
            }
            let again = parse_ini(&out).unwrap_or_else(|e| {
                panic!("{text:?} written back as {out:?} does not parse: {e:?}")
            });
            assert_eq!(again, ini, "{text:?} written back as {out:?}");
        }
        Err((line, reason)) => {
            assert!(line >= 1 && line <= text.lines().count(), "line {line}");
            assert!(!reason.is_empty());
        }
    }
});
