//! Object URLs:
//!
//! ```text
//! s3://BUCKET/KEY[?PARAM=VALUE[&...]]
//! ```
//!
//! - BUCKET: 3 to 63 characters of lower-case letters, digits, `.` and `-`
//!   (S3's rule; MinIO and SeaweedFS follow it).
//! - KEY: everything after the first `/` up to `?`, taken literally (no
//!   percent-decoding, as the AWS CLI takes `s3://` paths). A key that
//!   holds `?` cannot be written as a URL: use [`S3Url::new`].
//!
//! Parameters (each overrides what the environment and the AWS profile
//! say, [`crate::config`]):
//! - `endpoint=URL`: an S3-compatible server (`http://127.0.0.1:8333`);
//!   the AWS SDKs' `AWS_ENDPOINT_URL`.
//! - `region=NAME`: the signing region (`AWS_REGION`).
//! - `profile=NAME`: the AWS profile to read (`AWS_PROFILE`).
//! - `ca=PATH`: PEM file of the CAs to trust for an `https://` endpoint, in
//!   addition to the system's (`AWS_CA_BUNDLE`).
//! - `path_style=1` or `0`: path-style (`ENDPOINT/BUCKET/KEY`) or
//!   virtual-hosted (`BUCKET.ENDPOINT/KEY`) requests. Default: path-style
//!   for an endpoint given by URL, environment or profile (MinIO, Ceph RGW
//!   and SeaweedFS need it), virtual-hosted for AWS.
//! - `unsigned=1`: send requests without credentials (a public bucket;
//!   the AWS CLI's `--no-sign-request`).
//!
//! **Credentials never go in the URL**: a URL with `USER:SECRET@` is
//! refused, and the error quotes it with the secret replaced by `***`
//! ([`redact`]). They come from the environment or the profile files.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// The scheme of an object URL.
pub const SCHEME: &str = "s3://";

/// What a redacted secret prints as.
pub(crate) const REDACTED: &str = "***";

/// A parsed `s3://` URL: the object, and the settings it overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct S3Url {
    /// The bucket.
    pub bucket: String,
    /// The object's key (may be empty: a bucket URL, for `list`).
    pub key: String,
    /// `?endpoint=`.
    pub endpoint: Option<String>,
    /// `?region=`.
    pub region: Option<String>,
    /// `?profile=`.
    pub profile: Option<String>,
    /// `?ca=`.
    pub ca: Option<PathBuf>,
    /// `?path_style=`.
    pub path_style: Option<bool>,
    /// `?unsigned=1`.
    pub unsigned: bool,
}

/// An object URL that cannot be used. The URLs quoted are redacted.
#[derive(Debug, thiserror::Error, displaydoc::Display, PartialEq, Eq)]
#[non_exhaustive]
pub enum UrlError {
    /// '{url}' is not an S3 object URL: it must start with s3:// (e.g. s3://mybucket/data/weights.bin?endpoint=http://127.0.0.1:8333)
    Scheme {
        /// The URL given (redacted).
        url: String,
    },
    /// '{url}' holds credentials: an s3:// URL never does (they would end up in logs and shell history). Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or put them in a profile of ~/.aws/credentials
    Credentials {
        /// The URL given (redacted).
        url: String,
    },
    /// '{url}': bucket name '{bucket}' {reason}
    Bucket {
        /// The URL given (redacted).
        url: String,
        /// The bucket part.
        bucket: String,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// '{url}': {reason}
    Param {
        /// The URL given (redacted).
        url: String,
        /// What is wrong with which parameter.
        reason: String,
    },
}

impl S3Url {
    /// The object `key` of `bucket`, with no overrides (everything from
    /// the environment and the profile). The key is taken as it is.
    pub fn new(bucket: &str, key: &str) -> Result<S3Url, UrlError> {
        check_bucket(&format!("{SCHEME}{bucket}/{key}"), bucket)?;
        Ok(S3Url {
            bucket: bucket.to_string(),
            key: key.to_string(),
            endpoint: None,
            region: None,
            profile: None,
            ca: None,
            path_style: None,
            unsigned: false,
        })
    }

    /// The same settings, another key of the same bucket.
    pub fn with_key(&self, key: &str) -> S3Url {
        S3Url {
            key: key.to_string(),
            ..self.clone()
        }
    }
}

fn check_bucket(url: &str, b: &str) -> Result<(), UrlError> {
    let bad = |reason| UrlError::Bucket {
        url: redact(url),
        bucket: b.to_string(),
        reason,
    };
    if b.is_empty() {
        return Err(bad("is empty: write s3://BUCKET/KEY"));
    }
    if b.len() < 3 || b.len() > 63 {
        return Err(bad("must be 3 to 63 characters long"));
    }
    if !b
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
    {
        return Err(bad("may hold only lower-case letters, digits, '.' and '-'"));
    }
    if !b.as_bytes()[0].is_ascii_alphanumeric()
        || !b.as_bytes()[b.len() - 1].is_ascii_alphanumeric()
    {
        return Err(bad("must begin and end with a letter or a digit"));
    }
    Ok(())
}

fn flag(url: &str, name: &str, v: &str) -> Result<bool, UrlError> {
    match v {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        _ => Err(UrlError::Param {
            url: redact(url),
            reason: format!("{name}={v}: give {name}=1 or {name}=0"),
        }),
    }
}

impl FromStr for S3Url {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<S3Url, UrlError> {
        let Some(rest) = s.strip_prefix(SCHEME) else {
            return Err(UrlError::Scheme { url: redact(s) });
        };
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        let (bucket, key) = path.split_once('/').unwrap_or((path, ""));
        if bucket.contains('@') {
            return Err(UrlError::Credentials { url: redact(s) });
        }
        check_bucket(s, bucket)?;
        let mut u = S3Url::new(bucket, key)?;
        let param = |reason: String| UrlError::Param {
            url: redact(s),
            reason,
        };
        for kv in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| param(format!("parameter '{kv}' has no value (NAME=VALUE)")))?;
            if v.is_empty() {
                return Err(param(format!("parameter '{k}' has an empty value")));
            }
            match k {
                "endpoint" => {
                    if !(v.starts_with("http://") || v.starts_with("https://")) {
                        return Err(param(format!(
                            "endpoint={v}: give the server's URL with its scheme, http://HOST:PORT or https://HOST"
                        )));
                    }
                    if v.contains('@') {
                        return Err(UrlError::Credentials { url: redact(s) });
                    }
                    // A host after the scheme: `http://` alone had been
                    // kept as `http:` (its '/'s trimmed), which no client
                    // can use and which does not parse again (found by
                    // fuzz/fuzz_targets/store_url.rs).
                    let host = v.split_once("://").map_or("", |(_, h)| h);
                    if host.is_empty() || host.starts_with('/') {
                        return Err(param(format!(
                            "endpoint={v}: give the server's host, http://HOST:PORT or https://HOST"
                        )));
                    }
                    u.endpoint = Some(v.trim_end_matches('/').to_string());
                }
                "region" => u.region = Some(v.to_string()),
                "profile" => u.profile = Some(v.to_string()),
                "ca" => u.ca = Some(PathBuf::from(v)),
                "path_style" => u.path_style = Some(flag(s, k, v)?),
                "unsigned" => u.unsigned = flag(s, k, v)?,
                _ => {
                    return Err(param(format!(
                        "unknown parameter '{k}' (known: endpoint, region, profile, ca, path_style, unsigned)"
                    )))
                }
            }
        }
        Ok(u)
    }
}

impl fmt::Display for S3Url {
    /// The URL (it never holds a secret), parameters in a fixed order.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.bucket, self.key)?;
        let mut sep = '?';
        let mut p = |f: &mut fmt::Formatter<'_>, k: &str, v: &dyn fmt::Display| {
            let r = write!(f, "{sep}{k}={v}");
            sep = '&';
            r
        };
        if let Some(e) = &self.endpoint {
            p(f, "endpoint", e)?;
        }
        if let Some(r) = &self.region {
            p(f, "region", r)?;
        }
        if let Some(pr) = &self.profile {
            p(f, "profile", pr)?;
        }
        if let Some(c) = &self.ca {
            p(f, "ca", &c.display())?;
        }
        if let Some(ps) = self.path_style {
            p(f, "path_style", &u8::from(ps))?;
        }
        if self.unsigned {
            p(f, "unsigned", &1)?;
        }
        Ok(())
    }
}

/// `url` with anything that looks like credentials (`USER:SECRET@` after
/// `://`, in the URL or in an `endpoint=` inside it) replaced by `***`:
/// for quoting a URL that did not parse.
///
/// The URL's own authority ends where the parser's bucket does, at the
/// first '/' or '?' (it had ended at '&' and '#' too, so the refusal of
/// `s3://b&x:SECRET@h` quoted SECRET: found by
/// fuzz/fuzz_targets/store_url.rs); an `endpoint=`'s at the first '/', '?'
/// or '&' (the next parameter).
pub fn redact(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    let mut first = true;
    while let Some(i) = rest.find("://") {
        out.push_str(&rest[..i + 3]);
        rest = &rest[i + 3..];
        let end = if first {
            rest.find(['/', '?'])
        } else {
            rest.find(['/', '?', '&'])
        }
        .unwrap_or(rest.len());
        first = false;
        if let Some(at) = rest[..end].rfind('@') {
            out.push_str(REDACTED);
            rest = &rest[at..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_bucket_key_and_its_overrides() {
        let u: S3Url = "s3://data-1/a/b/w.bin?endpoint=http://127.0.0.1:8333/&region=eu-west-1&profile=p&ca=/x/ca.pem&path_style=0&unsigned=1"
            .parse()
            .unwrap();
        assert_eq!(u.bucket, "data-1");
        assert_eq!(u.key, "a/b/w.bin");
        assert_eq!(u.endpoint.as_deref(), Some("http://127.0.0.1:8333"));
        assert_eq!(u.region.as_deref(), Some("eu-west-1"));
        assert_eq!(u.profile.as_deref(), Some("p"));
        assert_eq!(u.ca, Some(PathBuf::from("/x/ca.pem")));
        assert_eq!(u.path_style, Some(false));
        assert!(u.unsigned);
        let again: S3Url = u.to_string().parse().unwrap();
        assert_eq!(again, u);
        let plain: S3Url = "s3://bkt/k".parse().unwrap();
        assert_eq!(plain.to_string(), "s3://bkt/k");
        assert_eq!(plain.path_style, None);
        assert!(!plain.unsigned);
    }

    #[test]
    fn each_bad_url_says_the_rule_it_broke() {
        let e = |s: &str| s.parse::<S3Url>().unwrap_err().to_string();
        assert!(
            e("http://b/k").contains("must start with s3://"),
            "{}",
            e("http://b/k")
        );
        assert!(e("s3:///k").contains("is empty"));
        assert!(e("s3://ab/k").contains("3 to 63"));
        assert!(e("s3://My_Bucket/k").contains("lower-case"));
        assert!(e("s3://-abc/k").contains("begin and end"));
        assert!(e("s3://abc/k?region").contains("has no value"));
        assert!(e("s3://abc/k?region=").contains("empty value"));
        assert!(e("s3://abc/k?endpoint=127.0.0.1:8333").contains("with its scheme"));
        assert!(e("s3://abc/k?path_style=maybe").contains("path_style=1 or path_style=0"));
        assert!(e("s3://abc/k?bogus=1").contains("unknown parameter 'bogus'"));
    }

    #[test]
    fn credentials_in_a_url_are_refused_and_never_quoted() {
        for s in [
            "s3://AKIAXX:sekrit@bucket/k",
            "s3://abc/k?endpoint=http://AKIAXX:sekrit@127.0.0.1:8333",
        ] {
            let e = s.parse::<S3Url>().unwrap_err();
            assert!(matches!(e, UrlError::Credentials { .. }), "{e}");
            let msg = e.to_string();
            assert!(!msg.contains("sekrit") && !msg.contains("AKIAXX"), "{msg}");
            assert!(msg.contains("***"), "{msg}");
            assert!(msg.contains("AWS_ACCESS_KEY_ID"), "{msg}");
        }
        // A URL that fails for another reason is redacted too.
        let msg = "http://u:sekrit@h/k"
            .parse::<S3Url>()
            .unwrap_err()
            .to_string();
        assert!(!msg.contains("sekrit"), "{msg}");
    }

    #[test]
    fn an_endpoint_without_a_host_is_refused() {
        for url in [
            "s3://bkt/k?endpoint=http://",
            "s3://bkt/k?endpoint=https:///x",
        ] {
            let e = url.parse::<S3Url>().unwrap_err().to_string();
            assert!(e.contains("give the server's host"), "{url}: {e}");
        }
        let u: S3Url = "s3://bkt/k?endpoint=http://h:1/".parse().unwrap();
        assert_eq!(u.endpoint.as_deref(), Some("http://h:1"));
        assert_eq!(u.to_string().parse::<S3Url>().unwrap(), u);
    }

    #[test]
    fn a_password_after_an_ampersand_or_a_hash_is_not_quoted() {
        // The parser's bucket runs to the first '/' or '?': an '@' after a
        // '&' or '#' there is a credential it refuses, and its message
        // quotes the URL redacted.
        for url in [
            "s3://ab&x:s3cret@h:7000",
            "s3://ab#x:s3cret@h/k",
            "s3://b/k?endpoint=http://u:s3cret#x@h",
        ] {
            let e = url.parse::<S3Url>().unwrap_err().to_string();
            assert!(!e.contains("s3cret"), "{url}: {e}");
            assert!(!redact(url).contains("s3cret"), "{url}");
        }
    }

    #[test]
    fn redact_hides_every_userinfo() {
        assert_eq!(redact("s3://b/k"), "s3://b/k");
        assert_eq!(redact("s3://u:p@b/k"), "s3://***@b/k");
        assert_eq!(
            redact("s3://b/k?endpoint=https://u:p@h:1&region=x"),
            "s3://b/k?endpoint=https://***@h:1&region=x"
        );
    }
}
