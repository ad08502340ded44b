//! Store URLs, as redis-py writes them:
//!
//! ```text
//! redis-cluster://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...][/NAME][?PARAM=VALUE[&...]]
//! rediss-cluster://...   the same over TLS
//! ```
//!
//! - HOST is a name, an IPv4 address or `[IPv6]`; PORT defaults to 6379
//!   ([`DEFAULT_PORT`], Redis's). The nodes are seeds: any one that
//!   answers tells the client the whole cluster.
//! - `USER:PASSWORD@` authenticates every connection (`AUTH USER
//!   PASSWORD`, an ACL user); `:PASSWORD@` authenticates as the `default`
//!   user (`requirepass`). Both are percent-decoded, as redis-py does: a
//!   password with `@`, `:`, `/`, `?`, `#` or `%` is written `%40`, `%3A`,
//!   `%2F`, `%3F`, `%23`, `%25`.
//! - NAME is a dataset's name (letters, digits, `.`, `_`, `-`; at most
//!   200 bytes); it becomes part of every key, inside a hash tag, so it may
//!   not contain `{`, `}` or `/`.
//!
//! Parameters:
//! - `min_replicas=N`: writes fail unless N replicas of the master
//!   acknowledge them (default 0: a master a failover left without replicas
//!   keeps taking writes, degraded; see `RedisOptions::min_replicas`).
//! - TLS only (`rediss-cluster://`): `ca=PATH` (PEM file of the CAs to
//!   trust instead of the system's store), `cert=PATH` and `key=PATH` (a
//!   client certificate and its key, PEM, for servers that ask for one:
//!   `tls-auth-clients yes`), `insecure=1` (no verification of the
//!   server's certificate: self-signed test setups only). redis-py's names
//!   are accepted too: `ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile`,
//!   `ssl_cert_reqs=none` (= `insecure=1`) or `required`.
//!
//! **Redaction.** The password is never printed: [`StoreUrl`]'s `Display`
//! and `Debug` write it as `***` (`redis-cluster://user:***@host:6379`), so
//! every message, log line and `Store::describe` built from a URL is safe
//! to show, and a [`UrlError`] redacts the URL it quotes ([`redact`]). The
//! price: a printed URL does not parse back to the same credentials.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// The scheme of a Redis Cluster store URL.
pub const SCHEME: &str = "redis-cluster://";

/// The scheme of a Redis Cluster store URL over TLS.
pub const TLS_SCHEME: &str = "rediss-cluster://";

/// The port of a node the URL gives without one (Redis's default).
pub const DEFAULT_PORT: u16 = 6379;

/// Longest dataset name accepted (a guess that keeps keys short).
const MAX_NAME: usize = 200;

/// What a redacted password prints as.
const REDACTED: &str = "***";

/// A password: compared and cloned, never printed (`Debug` and `Display`
/// write `***`); [`Password::expose`] gives it to the client.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// The password itself, for `AUTH` (never for a message).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// TLS settings of a `rediss-cluster://` URL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsParams {
    /// `?ca=PATH`: the CAs to trust (PEM), instead of the system's store.
    pub ca: Option<PathBuf>,
    /// `?cert=PATH`: a client certificate (PEM), with `key`.
    pub cert: Option<PathBuf>,
    /// `?key=PATH`: the client certificate's private key (PEM).
    pub key: Option<PathBuf>,
    /// `?insecure=1`: the server's certificate is not verified.
    pub insecure: bool,
}

/// A parsed store URL: seed nodes, credentials, TLS and an optional
/// dataset name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreUrl {
    /// Seed nodes (host, port).
    pub nodes: Vec<(String, u16)>,
    /// The dataset name, if the URL has one.
    pub name: Option<String>,
    /// `?min_replicas=N`, if given (overrides `RedisOptions::min_replicas`).
    pub min_replicas: Option<usize>,
    /// The ACL user (`USER:PASSWORD@`); None: the `default` user.
    pub user: Option<String>,
    /// The password, if any (never printed).
    pub password: Option<Password>,
    /// TLS (`rediss-cluster://`) and its settings; None: plain TCP.
    pub tls: Option<TlsParams>,
}

/// A store URL that cannot be used. The URLs quoted are redacted.
#[derive(Debug, thiserror::Error, displaydoc::Display, PartialEq, Eq)]
#[non_exhaustive]
pub enum UrlError {
    /// '{url}' is not a Redis Cluster store URL: it must start with redis-cluster:// or, for TLS, rediss-cluster:// (e.g. redis-cluster://127.0.0.1:7000/mydata)
    Scheme {
        /// The URL given (redacted).
        url: String,
    },
    /// '{url}' names no node: give at least one HOST[:PORT] after the scheme
    NoNodes {
        /// The URL given (redacted).
        url: String,
    },
    /// node '{node}' in the store URL is not HOST[:PORT]: {reason}
    Node {
        /// The bad part.
        node: String,
        /// What is wrong with it.
        reason: String,
    },
    /// the credentials in '{url}' are not [USER]:PASSWORD@: {reason}
    Credentials {
        /// The URL given (redacted).
        url: String,
        /// What is wrong with them.
        reason: String,
    },
    /// dataset name '{name}' in the store URL is not allowed: use 1 to 200 letters, digits, '.', '_' or '-'
    Name {
        /// The bad part.
        name: String,
    },
    /// '{param}' in the store URL is not a known parameter: the parameters are min_replicas=N, and with rediss-cluster:// ca=PATH, cert=PATH, key=PATH, insecure=1
    Param {
        /// The bad part (a value of a parameter named like a password is left out).
        param: String,
    },
    /// '{param}' in the store URL is not valid: {reason}
    Value {
        /// The parameter.
        param: String,
        /// What is wrong with its value.
        reason: String,
    },
    /// '{param}' is a TLS parameter: connect over TLS with rediss-cluster:// instead of redis-cluster://
    NotTls {
        /// The parameter's name.
        param: String,
    },
}

/// Checks a dataset name (see the module doc).
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// `s` with every `%XX` decoded; None if an escape is malformed or the
/// result is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `s` percent-encoded where a URL part needs it (everything but
/// unreserved characters and those in `keep`).
fn percent_encode(s: &str, keep: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') || keep.contains(&b)
        {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The authority of a URL after its scheme: up to the first `/`, `?` or
/// `#` (as `urllib.parse` splits it).
fn authority(rest: &str) -> &str {
    rest.find(['/', '?', '#']).map_or(rest, |e| &rest[..e])
}

/// `url` with the password of its credentials replaced by `***` (any
/// scheme; the text is left alone where there is no `USER:PASSWORD@`).
/// For quoting a URL that did not parse.
pub fn redact(url: &str) -> String {
    let Some(at_scheme) = url.find("://") else {
        return url.to_string();
    };
    let start = at_scheme + 3;
    let rest = &url[start..];
    let auth = authority(rest);
    // The last '@' before the first '/' or '?' (a password may hold an
    // unescaped '#': `u:p@w#x@h`, whose authority ends at '#', had its
    // `x` quoted; found by fuzz/fuzz_targets/store_url.rs), else an '@'
    // past the authority: a password with an unescaped '/', '?' or '#';
    // hide everything from the authority to that '@'.
    let wide = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let Some(at) = wide
        .rfind('@')
        .or_else(|| rest.rfind('@').filter(|_| rest[auth.len()..].contains('@')))
    else {
        return url.to_string();
    };
    let userinfo = &rest[..at];
    match userinfo.find(':') {
        Some(colon) => format!(
            "{}{}:{REDACTED}{}",
            &url[..start],
            &userinfo[..colon],
            &rest[at..]
        ),
        // No ':': a user alone, or a password written without its ':'
        // (redis-py reads `PASSWORD@` as a user name): hide it all.
        None => format!("{}{REDACTED}{}", &url[..start], &rest[at..]),
    }
}

fn parse_node(s: &str) -> Result<(String, u16), UrlError> {
    let bad = |reason: &str| UrlError::Node {
        node: s.to_string(),
        reason: reason.to_string(),
    };
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        // [IPv6] or [IPv6]:PORT
        let (h, tail) = rest
            .split_once(']')
            .ok_or_else(|| bad("an IPv6 address is written [ADDR]:PORT (the ']' is missing)"))?;
        match tail {
            "" => (h, None),
            t => (
                h,
                Some(t.strip_prefix(':').ok_or_else(|| {
                    bad("an IPv6 address is written [ADDR]:PORT (':' after ']')")
                })?),
            ),
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err(bad("the host is empty"));
    }
    if !s.starts_with('[') && host.contains(':') {
        return Err(bad(
            "an IPv6 address is written in brackets: [ADDR] or [ADDR]:PORT",
        ));
    }
    if host.contains(|c: char| c.is_whitespace() || matches!(c, '/' | '@' | '[' | ']')) {
        return Err(bad("the host has a character a host name cannot have"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(bad(
                    "the port is not a number from 1 to 65535 (leave it out for 6379)",
                ))
            }
        },
    };
    Ok((host.to_string(), port))
}

/// A URL parameter, known under its name or redis-py's.
enum Param {
    MinReplicas,
    Ca,
    Cert,
    Key,
    Insecure,
    /// redis-py's `ssl_cert_reqs`: `none` is `insecure=1`.
    CertReqs,
}

impl Param {
    fn by_name(name: &str) -> Option<Param> {
        Some(match name {
            "min_replicas" => Param::MinReplicas,
            "ca" | "ssl_ca_certs" => Param::Ca,
            "cert" | "ssl_certfile" => Param::Cert,
            "key" | "ssl_keyfile" => Param::Key,
            "insecure" => Param::Insecure,
            "ssl_cert_reqs" => Param::CertReqs,
            _ => return None,
        })
    }
}

impl FromStr for StoreUrl {
    type Err = UrlError;
    fn from_str(url: &str) -> Result<StoreUrl, UrlError> {
        let (rest, tls) = if let Some(r) = url.strip_prefix(SCHEME) {
            (r, false)
        } else if let Some(r) = url.strip_prefix(TLS_SCHEME) {
            (r, true)
        } else {
            return Err(UrlError::Scheme { url: redact(url) });
        };
        let creds_err = |reason: &str| UrlError::Credentials {
            url: redact(url),
            reason: reason.to_string(),
        };
        // Credentials: up to the last '@' of the authority (urllib's rule).
        let auth = authority(rest);
        let (userinfo, rest) = match auth.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None if rest.contains('@') => {
                return Err(creds_err(
                    "an '@' follows a '/', '?' or '#': write those characters of a password \
                     as %2F, %3F, %23 (and '@' as %40)",
                ))
            }
            None => (None, rest),
        };
        let (mut user, mut password) = (None, None);
        if let Some(ui) = userinfo {
            let Some((u, p)) = ui.split_once(':') else {
                return Err(creds_err(
                    "a user needs a password (USER:PASSWORD@), a password alone is written \
                     :PASSWORD@",
                ));
            };
            let u = percent_decode(u)
                .ok_or_else(|| creds_err("the user has a bad %-escape (write % as %25)"))?;
            let p = percent_decode(p)
                .ok_or_else(|| creds_err("the password has a bad %-escape (write % as %25)"))?;
            if p.is_empty() {
                return Err(creds_err(
                    "the password is empty: give one, or leave the credentials out",
                ));
            }
            user = (!u.is_empty()).then_some(u);
            password = Some(Password(p));
        }
        if let Some((_, frag)) = rest.split_once('#') {
            // An '@' after the '#': the rest of a password holding '#'
            // (`u:p@w#x@h`), not to be quoted.
            if frag.contains('@') {
                return Err(creds_err(
                    "an '@' follows a '/', '?' or '#': write those characters of a password \
                     as %2F, %3F, %23 (and '@' as %40)",
                ));
            }
            return Err(UrlError::Param {
                param: format!("#{frag}"),
            });
        }
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let mut min_replicas = None;
        let mut tp = TlsParams::default();
        for param in query.into_iter().flat_map(|q| q.split('&')) {
            if param.is_empty() {
                continue;
            }
            let (k, v) = param.split_once('=').unwrap_or((param, ""));
            let Some(which) = Param::by_name(k) else {
                // Never echo what may be a password.
                let shown = if k.contains("pass") { k } else { param };
                return Err(UrlError::Param {
                    param: shown.to_string(),
                });
            };
            let value_err = |reason: &str| UrlError::Value {
                param: param.to_string(),
                reason: reason.to_string(),
            };
            if !tls && !matches!(which, Param::MinReplicas) {
                return Err(UrlError::NotTls {
                    param: k.to_string(),
                });
            }
            let path = || -> Result<PathBuf, UrlError> {
                match percent_decode(v) {
                    Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
                    Some(_) => Err(value_err("give the path of a PEM file")),
                    None => Err(value_err("the path has a bad %-escape (write % as %25)")),
                }
            };
            match which {
                Param::MinReplicas => {
                    min_replicas = Some(
                        v.parse::<usize>()
                            .map_err(|_| value_err("min_replicas=N takes a number of replicas"))?,
                    );
                }
                Param::Ca => tp.ca = Some(path()?),
                Param::Cert => tp.cert = Some(path()?),
                Param::Key => tp.key = Some(path()?),
                Param::Insecure => {
                    tp.insecure = match v {
                        "1" | "true" | "yes" => true,
                        "0" | "false" | "no" => false,
                        _ => return Err(value_err("insecure takes 1 or 0")),
                    }
                }
                Param::CertReqs => {
                    tp.insecure = match v {
                        "none" => true,
                        "required" => false,
                        _ => {
                            return Err(value_err(
                                "ssl_cert_reqs takes none (= insecure=1) or required",
                            ))
                        }
                    }
                }
            }
        }
        if tp.cert.is_some() != tp.key.is_some() {
            return Err(UrlError::Value {
                param: if tp.cert.is_some() { "cert" } else { "key" }.to_string(),
                reason: "a client certificate needs both cert=PATH and key=PATH".to_string(),
            });
        }
        if tp.insecure && tp.ca.is_some() {
            return Err(UrlError::Value {
                param: "insecure=1".to_string(),
                reason: "it skips the verification that ca=PATH is for: give one of them"
                    .to_string(),
            });
        }
        let (nodes, name) = match rest.split_once('/') {
            Some((n, name)) => (n, Some(name)),
            None => (rest, None),
        };
        if nodes.is_empty() {
            return Err(UrlError::NoNodes { url: redact(url) });
        }
        let nodes = nodes
            .split(',')
            .map(parse_node)
            .collect::<Result<Vec<_>, _>>()?;
        let name = match name {
            None | Some("") => None,
            Some(n) if valid_name(n) => Some(n.to_string()),
            Some(n) => {
                return Err(UrlError::Name {
                    name: n.to_string(),
                })
            }
        };
        Ok(StoreUrl {
            nodes,
            name,
            min_replicas,
            user,
            password,
            tls: tls.then_some(tp),
        })
    }
}

/// Prints the URL with its password as `***` (see the module doc).
impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.tls.is_some() {
            TLS_SCHEME
        } else {
            SCHEME
        })?;
        if let Some(p) = &self.password {
            let user = self.user.as_deref().unwrap_or("");
            write!(f, "{}:{p}@", percent_encode(user, b""))?;
        }
        f.write_str(&self.hosts())?;
        if let Some(n) = &self.name {
            write!(f, "/{n}")?;
        }
        let mut sep = '?';
        let mut param = |f: &mut fmt::Formatter<'_>, k: &str, v: &str| {
            let r = write!(f, "{sep}{k}={v}");
            sep = '&';
            r
        };
        if let Some(m) = self.min_replicas {
            param(f, "min_replicas", &m.to_string())?;
        }
        if let Some(t) = &self.tls {
            for (k, p) in [("ca", &t.ca), ("cert", &t.cert), ("key", &t.key)] {
                if let Some(p) = p {
                    param(f, k, &percent_encode(&p.to_string_lossy(), b"/"))?;
                }
            }
            if t.insecure {
                param(f, "insecure", "1")?;
            }
        }
        Ok(())
    }
}

impl StoreUrl {
    /// The seed nodes as `HOST:PORT,HOST:PORT`.
    fn hosts(&self) -> String {
        let mut s = String::new();
        for (i, (h, p)) in self.nodes.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            if h.contains(':') {
                s.push_str(&format!("[{h}]:{p}"));
            } else {
                s.push_str(&format!("{h}:{p}"));
            }
        }
        s
    }

    /// The seed nodes as `HOST:PORT, HOST:PORT` (for messages; no
    /// credentials), with `(TLS)` after them over TLS.
    pub fn addresses(&self) -> String {
        let h = self.hosts().replace(',', ", ");
        if self.tls.is_some() {
            format!("{h} (TLS)")
        } else {
            h
        }
    }

    /// The same cluster (nodes, credentials, TLS) with dataset `name`.
    pub fn with_name(&self, name: &str) -> StoreUrl {
        StoreUrl {
            name: Some(name.to_string()),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> StoreUrl {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn err(s: &str) -> String {
        s.parse::<StoreUrl>().unwrap_err().to_string()
    }

    #[test]
    fn parses_nodes_and_name_and_prints_them_back() {
        let u = parse("redis-cluster://127.0.0.1:7000,host-b:7001/my.data_1");
        assert_eq!(
            u.nodes,
            vec![("127.0.0.1".into(), 7000), ("host-b".into(), 7001)]
        );
        assert_eq!(u.name.as_deref(), Some("my.data_1"));
        assert_eq!((&u.user, &u.password, &u.tls), (&None, &None, &None));
        assert_eq!(
            u.to_string(),
            "redis-cluster://127.0.0.1:7000,host-b:7001/my.data_1"
        );
        let u = parse("redis-cluster://[::1]:7000");
        assert_eq!(u.nodes, vec![("::1".into(), 7000)]);
        assert_eq!(u.name, None);
        assert_eq!(u.to_string(), "redis-cluster://[::1]:7000");
        let u = parse("redis-cluster://h:1/");
        assert_eq!(u.name, None);
        assert_eq!(u.addresses(), "h:1");
    }

    #[test]
    fn a_node_without_a_port_is_on_6379() {
        let u = parse("redis-cluster://cache.example.com/d");
        assert_eq!(u.nodes, vec![("cache.example.com".into(), DEFAULT_PORT)]);
        assert_eq!(u.to_string(), "redis-cluster://cache.example.com:6379/d");
        let u = parse("redis-cluster://a,b:7001,[::1],[fe80::2]:7002");
        assert_eq!(
            u.nodes,
            vec![
                ("a".into(), 6379),
                ("b".into(), 7001),
                ("::1".into(), 6379),
                ("fe80::2".into(), 7002)
            ]
        );
        let u = parse("redis-cluster://:pw@h");
        assert_eq!(u.nodes, vec![("h".into(), 6379)]);
    }

    #[test]
    fn credentials_as_redis_py_writes_them() {
        // USER:PASSWORD@ (an ACL user).
        let u = parse("redis-cluster://alice:s3cret@h:7000,h:7001/d");
        assert_eq!(u.user.as_deref(), Some("alice"));
        assert_eq!(u.password.as_ref().map(Password::expose), Some("s3cret"));
        assert_eq!(u.nodes.len(), 2);
        // :PASSWORD@ (requirepass, the default user).
        let u = parse("redis-cluster://:s3cret@h");
        assert_eq!(u.user, None);
        assert_eq!(u.password.as_ref().map(Password::expose), Some("s3cret"));
        // Percent-decoded: '@', ':', '/', '%' in a password.
        let u = parse("redis-cluster://b%40b:p%40ss%3Aw%2Fo%25rd@[::1]:7000/d");
        assert_eq!(u.user.as_deref(), Some("b@b"));
        assert_eq!(
            u.password.as_ref().map(Password::expose),
            Some("p@ss:w/o%rd")
        );
        assert_eq!(u.nodes, vec![("::1".into(), 7000)]);
        // The last '@' of the authority ends the credentials (urllib's rule).
        let u = parse("redis-cluster://:a@b@h:1");
        assert_eq!(u.password.as_ref().map(Password::expose), Some("a@b"));
        assert_eq!(u.nodes, vec![("h".into(), 1)]);
        // with_name keeps them.
        let n = u.with_name("x");
        assert_eq!(n.password, u.password);
        assert_eq!(n.name.as_deref(), Some("x"));
    }

    #[test]
    fn the_password_is_never_printed() {
        let u = parse("rediss-cluster://alice:hunter2@h:7000/d?ca=/etc/ca.pem");
        assert_eq!(
            u.to_string(),
            "rediss-cluster://alice:***@h:7000/d?ca=/etc/ca.pem"
        );
        assert_eq!(
            parse("redis-cluster://:hunter2@h").to_string(),
            "redis-cluster://:***@h:6379"
        );
        let dbg = format!("{u:?}");
        assert!(!dbg.contains("hunter2"), "{dbg}");
        assert!(dbg.contains("***"), "{dbg}");
        assert!(!u.addresses().contains("hunter2"));
        assert!(!u.with_name("x").to_string().contains("hunter2"));
        // Errors quote the URL redacted.
        for bad in [
            "redis://alice:hunter2@h:1/d",
            "redis-cluster://alice:hunter2@/d",
            "redis-cluster://alice:hunter2@h:1/d{",
            "redis-cluster://alice:hunter2@h:x",
            "redis-cluster://alice:hunt/er2@h:1",
            "redis-cluster://alice:hunter2@h:1?password=hunter2",
            "redis-cluster://alice:hunter2@h:1?ca=/x",
            "redis-cluster://alice:hunter2%zz@h:1",
            "redis-cluster://hunter2@h:1",
        ] {
            let e = err(bad);
            assert!(!e.contains("hunter2") && !e.contains("hunt"), "{bad}: {e}");
        }
        assert_eq!(
            err("redis://alice:hunter2@h:1/d"),
            "'redis://alice:***@h:1/d' is not a Redis Cluster store URL: it must start with \
             redis-cluster:// or, for TLS, rediss-cluster:// (e.g. \
             redis-cluster://127.0.0.1:7000/mydata)"
        );
        assert_eq!(redact("redis-cluster://u:p@h"), "redis-cluster://u:***@h");
        assert_eq!(redact("redis-cluster://h:1/x"), "redis-cluster://h:1/x");
        assert_eq!(redact("no scheme:pw@x"), "no scheme:pw@x");
        assert_eq!(redact("redis-cluster://u:p/q@h"), "redis-cluster://u:***@h");
        assert_eq!(redact("redis-cluster://pq/r@h"), "redis-cluster://***@h");
        assert_eq!(redact("redis-cluster://pw@h"), "redis-cluster://***@h");
    }

    #[test]
    fn a_password_holding_a_hash_and_an_at_is_never_quoted() {
        // urllib's authority ends at '#': `u:p@w#x@h` reads as user u,
        // password p, host w and a fragment quoted in the error; the
        // password was `p@w#x`.
        for bad in [
            "redis-cluster://u:hun@ter#2x@h:1/d",
            "redisx-cluster://u:hun@ter#2x@h:1/d",
            "redis-cluster://_hunter@h#x:ter2x@h",
        ] {
            let e = err(bad);
            assert!(!e.contains("ter#2x") && !e.contains("ter2x"), "{bad}: {e}");
        }
        assert_eq!(
            redact("redis-cluster://u:p@w#x@h"),
            "redis-cluster://u:***@h"
        );
        // A fragment with no '@' is still named.
        assert!(err("redis-cluster://h:1/d#frag").contains("#frag"));
    }

    #[test]
    fn tls_urls_and_their_parameters() {
        let u = parse("rediss-cluster://h:7000/d?ca=/tmp/a%20b/ca.crt&min_replicas=1");
        let t = u.tls.clone().unwrap();
        assert_eq!(
            t.ca.as_deref(),
            Some(std::path::Path::new("/tmp/a b/ca.crt"))
        );
        assert!(!t.insecure);
        assert_eq!(u.min_replicas, Some(1));
        assert_eq!(
            u.to_string(),
            "rediss-cluster://h:7000/d?min_replicas=1&ca=/tmp/a%20b/ca.crt"
        );
        assert_eq!(u.addresses(), "h:7000 (TLS)");
        assert_eq!(parse(&u.to_string()), u);
        let u = parse("rediss-cluster://h?insecure=1&cert=/c.pem&key=/k.pem");
        let t = u.tls.clone().unwrap();
        assert!(t.insecure);
        assert_eq!(t.cert.as_deref(), Some(std::path::Path::new("/c.pem")));
        assert_eq!(t.key.as_deref(), Some(std::path::Path::new("/k.pem")));
        assert_eq!(parse(&u.to_string()), u);
        // No parameter: the system's CA store, verification on.
        assert_eq!(parse("rediss-cluster://h").tls, Some(TlsParams::default()));
        // redis-py's names.
        let u = parse("rediss-cluster://h?ssl_ca_certs=/ca&ssl_certfile=/c&ssl_keyfile=/k");
        let t = u.tls.unwrap();
        assert_eq!(
            (t.ca.unwrap(), t.cert.unwrap(), t.key.unwrap()),
            ("/ca".into(), "/c".into(), "/k".into())
        );
        assert!(
            parse("rediss-cluster://h?ssl_cert_reqs=none")
                .tls
                .unwrap()
                .insecure
        );
        assert!(
            !parse("rediss-cluster://h?ssl_cert_reqs=required")
                .tls
                .unwrap()
                .insecure
        );
    }

    #[test]
    fn bad_urls_say_the_rule() {
        assert!(err("redis-cluster:///x").contains("names no node"));
        assert!(err("redis-cluster://").contains("names no node"));
        assert!(err("redis-cluster://a:7000,b:70000").contains("node 'b:70000'"));
        assert_eq!(
            err("redis-cluster://a:x"),
            "node 'a:x' in the store URL is not HOST[:PORT]: the port is not a number from \
             1 to 65535 (leave it out for 6379)"
        );
        assert!(err("redis-cluster://:7000").contains("host is empty"));
        assert!(err("redis-cluster://a:0").contains("node 'a:0'"));
        assert!(err("redis-cluster://a:").contains("node 'a:'"));
        assert_eq!(
            err("redis-cluster://::1:7000"),
            "node '::1:7000' in the store URL is not HOST[:PORT]: an IPv6 address is written \
             in brackets: [ADDR] or [ADDR]:PORT"
        );
        assert!(err("redis-cluster://[::1:7000").contains("']' is missing"));
        assert!(err("redis-cluster://[::1]7000").contains("':' after ']'"));
        assert_eq!(
            err("redis-cluster://a:1/x{y}"),
            "dataset name 'x{y}' in the store URL is not allowed: use 1 to 200 letters, \
             digits, '.', '_' or '-'"
        );
        assert!(err("redis-cluster://a:1/a/b").contains("'a/b'"));
        assert!(err("redis-cluster://a:1/d?replicas=2").contains("'replicas=2'"));
        assert_eq!(
            err("redis-cluster://a:1/d?min_replicas=x"),
            "'min_replicas=x' in the store URL is not valid: min_replicas=N takes a number \
             of replicas"
        );
        assert!(err("redis-cluster://a:1/d#insecure").contains("'#insecure'"));
        // Credentials.
        assert_eq!(
            err("redis-cluster://alice@h:1"),
            "the credentials in 'redis-cluster://***@h:1' are not [USER]:PASSWORD@: a user \
             needs a password (USER:PASSWORD@), a password alone is written :PASSWORD@"
        );
        assert!(err("redis-cluster://alice:@h:1").contains("the password is empty"));
        assert!(err("redis-cluster://:p%4@h:1").contains("bad %-escape"));
        assert!(err("redis-cluster://:p/q@h:1").contains("%2F"));
        // TLS parameters.
        assert_eq!(
            err("redis-cluster://h:1?ca=/ca.pem"),
            "'ca' is a TLS parameter: connect over TLS with rediss-cluster:// instead of \
             redis-cluster://"
        );
        assert!(err("redis-cluster://h:1?insecure=1").contains("rediss-cluster://"));
        assert!(err("rediss-cluster://h:1?insecure=maybe").contains("insecure takes 1 or 0"));
        assert!(err("rediss-cluster://h:1?cert=/c").contains("both cert=PATH and key=PATH"));
        assert!(err("rediss-cluster://h:1?key=/k").contains("both cert=PATH and key=PATH"));
        assert!(err("rediss-cluster://h:1?ca=").contains("path of a PEM file"));
        assert!(err("rediss-cluster://h:1?ca=/c&insecure=1").contains("give one of them"));
        assert!(err("rediss-cluster://h:1?ssl_cert_reqs=optional").contains("none"));
        assert_eq!(
            err("rediss-cluster://h:1?password=x"),
            "'password' in the store URL is not a known parameter: the parameters are \
             min_replicas=N, and with rediss-cluster:// ca=PATH, cert=PATH, key=PATH, insecure=1"
        );
    }

    #[test]
    fn min_replicas_parameter_round_trips() {
        let u = parse("redis-cluster://h:1/d?min_replicas=2");
        assert_eq!(u.name.as_deref(), Some("d"));
        assert_eq!(u.min_replicas, Some(2));
        assert_eq!(u.to_string(), "redis-cluster://h:1/d?min_replicas=2");
        let u = parse("redis-cluster://h:1?min_replicas=0");
        assert_eq!((u.name.as_deref(), u.min_replicas), (None, Some(0)));
        assert_eq!(
            u.with_name("x").to_string(),
            "redis-cluster://h:1/x?min_replicas=0"
        );
    }
}
