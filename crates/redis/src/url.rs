//! Store URLs: `redis-cluster://HOST:PORT[,HOST:PORT...][/NAME][?min_replicas=N]`.
//!
//! Query parameters (the only one so far):
//! - `min_replicas=N`: writes fail unless N replicas of the master
//!   acknowledge them (default 0: a master a failover left without replicas
//!   keeps taking writes, degraded; see `RedisOptions::min_replicas`).
//!
//! The nodes are seeds: any one that answers tells the client the whole
//! cluster. NAME is a dataset's name (letters, digits, `.`, `_`, `-`; at
//! most 200 bytes); it becomes part of every key, inside a hash tag, so it
//! may not contain `{`, `}` or `/`.

use std::fmt;
use std::str::FromStr;

/// The scheme of a Redis Cluster store URL.
pub const SCHEME: &str = "redis-cluster://";

/// Longest dataset name accepted (a guess that keeps keys short).
const MAX_NAME: usize = 200;

/// A parsed store URL: seed nodes and an optional dataset name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUrl {
    /// Seed nodes (host, port).
    pub nodes: Vec<(String, u16)>,
    /// The dataset name, if the URL has one.
    pub name: Option<String>,
    /// `?min_replicas=N`, if given (overrides `RedisOptions::min_replicas`).
    pub min_replicas: Option<usize>,
}

/// A store URL that cannot be used.
#[derive(Debug, thiserror::Error, displaydoc::Display, PartialEq, Eq)]
#[non_exhaustive]
pub enum UrlError {
    /// '{url}' is not a Redis Cluster store URL: it must start with redis-cluster:// (e.g. redis-cluster://127.0.0.1:7000/mydata)
    Scheme {
        /// The URL given.
        url: String,
    },
    /// '{url}' names no node: give at least one HOST:PORT after redis-cluster://
    NoNodes {
        /// The URL given.
        url: String,
    },
    /// node '{node}' in the store URL is not HOST:PORT: {reason}
    Node {
        /// The bad part.
        node: String,
        /// What is wrong with it.
        reason: String,
    },
    /// dataset name '{name}' in the store URL is not allowed: use 1 to 200 letters, digits, '.', '_' or '-'
    Name {
        /// The bad part.
        name: String,
    },
    /// '{param}' in the store URL is not a known parameter: the only one is ?min_replicas=N (N a number of replicas)
    Param {
        /// The bad part.
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

fn parse_node(s: &str) -> Result<(String, u16), UrlError> {
    let bad = |reason: &str| UrlError::Node {
        node: s.to_string(),
        reason: reason.to_string(),
    };
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        // [IPv6]:PORT
        let (h, p) = rest
            .split_once("]:")
            .ok_or_else(|| bad("an IPv6 address is written [ADDR]:PORT"))?;
        (h, p)
    } else {
        s.rsplit_once(':')
            .ok_or_else(|| bad("the port is missing (HOST:PORT, e.g. 127.0.0.1:7000)"))?
    };
    if host.is_empty() {
        return Err(bad("the host is empty"));
    }
    if host.contains(|c: char| c.is_whitespace() || c == '/' || c == '@') {
        return Err(bad("the host has a character a host name cannot have"));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| bad("the port is not a number from 1 to 65535"))?;
    if port == 0 {
        return Err(bad("the port is not a number from 1 to 65535"));
    }
    Ok((host.to_string(), port))
}

impl FromStr for StoreUrl {
    type Err = UrlError;
    fn from_str(url: &str) -> Result<StoreUrl, UrlError> {
        let rest = url.strip_prefix(SCHEME).ok_or_else(|| UrlError::Scheme {
            url: url.to_string(),
        })?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let mut min_replicas = None;
        for param in query.into_iter().flat_map(|q| q.split('&')) {
            match param.split_once('=') {
                Some(("min_replicas", n)) if n.parse::<usize>().is_ok() => {
                    min_replicas = n.parse().ok();
                }
                _ => {
                    return Err(UrlError::Param {
                        param: param.to_string(),
                    })
                }
            }
        }
        let (nodes, name) = match rest.split_once('/') {
            Some((n, name)) => (n, Some(name)),
            None => (rest, None),
        };
        if nodes.is_empty() {
            return Err(UrlError::NoNodes {
                url: url.to_string(),
            });
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
        })
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(SCHEME)?;
        for (i, (h, p)) in self.nodes.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if h.contains(':') {
                write!(f, "[{h}]:{p}")?;
            } else {
                write!(f, "{h}:{p}")?;
            }
        }
        if let Some(n) = &self.name {
            write!(f, "/{n}")?;
        }
        if let Some(m) = self.min_replicas {
            write!(f, "?min_replicas={m}")?;
        }
        Ok(())
    }
}

impl StoreUrl {
    /// The seed nodes as `HOST:PORT, HOST:PORT` (for messages).
    pub fn addresses(&self) -> String {
        let mut u = self.clone();
        u.name = None;
        u.min_replicas = None;
        u.to_string()[SCHEME.len()..].replace(',', ", ")
    }

    /// The same nodes with dataset `name`.
    pub fn with_name(&self, name: &str) -> StoreUrl {
        StoreUrl {
            nodes: self.nodes.clone(),
            name: Some(name.to_string()),
            min_replicas: self.min_replicas,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nodes_and_name_and_prints_them_back() {
        let u: StoreUrl = "redis-cluster://127.0.0.1:7000,host-b:7001/my.data_1"
            .parse()
            .unwrap();
        assert_eq!(
            u.nodes,
            vec![("127.0.0.1".into(), 7000), ("host-b".into(), 7001)]
        );
        assert_eq!(u.name.as_deref(), Some("my.data_1"));
        assert_eq!(
            u.to_string(),
            "redis-cluster://127.0.0.1:7000,host-b:7001/my.data_1"
        );
        let u: StoreUrl = "redis-cluster://[::1]:7000".parse().unwrap();
        assert_eq!(u.nodes, vec![("::1".into(), 7000)]);
        assert_eq!(u.name, None);
        assert_eq!(u.to_string(), "redis-cluster://[::1]:7000");
        let u: StoreUrl = "redis-cluster://h:1/".parse().unwrap();
        assert_eq!(u.name, None);
        assert_eq!(u.addresses(), "h:1");
    }

    #[test]
    fn bad_urls_name_the_bad_part() {
        let err = |s: &str| s.parse::<StoreUrl>().unwrap_err().to_string();
        assert_eq!(
            err("redis://127.0.0.1:7000"),
            "'redis://127.0.0.1:7000' is not a Redis Cluster store URL: it must start with \
             redis-cluster:// (e.g. redis-cluster://127.0.0.1:7000/mydata)"
        );
        assert!(err("redis-cluster:///x").contains("names no node"));
        assert_eq!(
            err("redis-cluster://127.0.0.1"),
            "node '127.0.0.1' in the store URL is not HOST:PORT: the port is missing \
             (HOST:PORT, e.g. 127.0.0.1:7000)"
        );
        assert!(err("redis-cluster://a:7000,b:70000").contains("node 'b:70000'"));
        assert!(err("redis-cluster://a:x").contains("not a number"));
        assert!(err("redis-cluster://:7000").contains("host is empty"));
        assert!(err("redis-cluster://a:0").contains("node 'a:0'"));
        assert_eq!(
            err("redis-cluster://a:1/x{y}"),
            "dataset name 'x{y}' in the store URL is not allowed: use 1 to 200 letters, \
             digits, '.', '_' or '-'"
        );
        assert!(err("redis-cluster://a:1/a/b").contains("'a/b'"));
        assert!(err("redis-cluster://a:1/d?replicas=2").contains("'replicas=2'"));
        assert!(err("redis-cluster://a:1/d?min_replicas=x").contains("min_replicas=N"));
    }

    #[test]
    fn min_replicas_parameter_round_trips() {
        let u: StoreUrl = "redis-cluster://h:1/d?min_replicas=2".parse().unwrap();
        assert_eq!(u.name.as_deref(), Some("d"));
        assert_eq!(u.min_replicas, Some(2));
        assert_eq!(u.to_string(), "redis-cluster://h:1/d?min_replicas=2");
        let u: StoreUrl = "redis-cluster://h:1?min_replicas=0".parse().unwrap();
        assert_eq!((u.name.as_deref(), u.min_replicas), (None, Some(0)));
        assert_eq!(
            u.with_name("x").to_string(),
            "redis-cluster://h:1/x?min_replicas=0"
        );
    }
}
