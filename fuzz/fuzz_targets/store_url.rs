//! Store URLs (crates/stores/src/lib.rs `AnyUrl`, which dispatches to
//! crates/redis/src/url.rs `StoreUrl` and crates/s3/src/url.rs `S3Url`):
//! from the command line, the C and Python APIs, and `UPAGER_UMAP_STORE`.
//!
//! Holds: a URL that parses prints as a URL that parses to the same
//! (Redis: but for the password, printed `***`); the password never
//! reaches the printed URL or its `Debug` (both are the same whatever the
//! password); a URL that is refused gets the documented error
//! (`UrlError`), whose message does not quote the password.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "alloc_cap.rs"]
mod alloc_cap;
use upager_redis::StoreUrl;
use upager_s3::S3Url;
use upager_stores::AnyUrl;

/// The password, as widely as a parser might take it: after the first ':'
/// of the userinfo, up to the last '@' before the first '/' or '?' of what
/// follows "://" (the S3 parser's bucket ends only there; urllib's
/// authority also ends at '#').
fn password_of(s: &str) -> Option<&str> {
    let rest = &s[s.find("://")? + 3..];
    let auth = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let ui = &auth[..auth.rfind('@')?];
    Some(&ui[ui.find(':')? + 1..])
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match s.parse::<AnyUrl>() {
        Ok(AnyUrl::S3(u)) => {
            let printed = u.to_string();
            let v: S3Url = printed.parse().unwrap_or_else(|e| {
                panic!("{s:?} printed as {printed:?}, which does not parse: {e}")
            });
            assert_eq!(v, u, "{s:?} printed as {printed:?}");
        }
        Ok(AnyUrl::Redis(u)) => {
            let printed = u.to_string();
            let v: StoreUrl = printed.parse().unwrap_or_else(|e| {
                panic!("{s:?} printed as {printed:?}, which does not parse: {e}")
            });
            assert_eq!(v.nodes, u.nodes, "{s:?} printed as {printed:?}");
            assert_eq!(v.name, u.name);
            assert_eq!(v.min_replicas, u.min_replicas);
            assert_eq!(v.user, u.user, "{s:?} printed as {printed:?}");
            assert_eq!(v.tls, u.tls, "{s:?} printed as {printed:?}");
            assert_eq!(v.password.is_some(), u.password.is_some());
            if let Some(p) = &v.password {
                assert_eq!(p.expose(), "***");
            }
            // v is u with the password `***`: what prints does not depend
            // on the password.
            assert_eq!(v.to_string(), printed);
            assert_eq!(format!("{v:?}"), format!("{u:?}"));
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.is_empty());
            if let Some(p) = password_of(s) {
                // Only a password that is not also elsewhere in the input
                // (a message may quote the other parts), and with no '*'
                // (it may match the `***` that replaces it).
                if p.len() >= 4 && !p.contains('*') && s.matches(p).count() == 1 {
                    // The same URL with another password: where the message
                    // holds `p` either way, `p` is the message's own text
                    // (its example URL), not the password.
                    let other = s.replacen(p, "\u{1}\u{2}\u{3}\u{4}", 1);
                    let theirs = match other.parse::<AnyUrl>() {
                        Err(e2) => format!("{e2} {e2:?}"),
                        Ok(_) => String::new(),
                    };
                    let quoted = |t: &str| t.contains(p) && !theirs.contains(p);
                    assert!(
                        !quoted(&msg),
                        "{s:?}: the message quotes the password: {msg}"
                    );
                    assert!(
                        !quoted(&format!("{e:?}")),
                        "{s:?}: Debug quotes the password"
                    );
                }
            }
        }
    }
});
