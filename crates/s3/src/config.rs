//! Credentials, region and endpoint, found as the AWS SDKs find them.
//!
//! Precedence, first found wins (the AWS CLI's and SDKs' order):
//!
//! ```text
//! setting      URL parameter   environment                               profile (config / credentials file)
//! credentials  ?unsigned=1     AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY  aws_access_key_id + aws_secret_access_key
//!                              (+ AWS_SESSION_TOKEN)                      (+ aws_session_token): credentials file first
//! region       ?region=        AWS_REGION, AWS_DEFAULT_REGION             region                 (else us-east-1)
//! endpoint     ?endpoint=      AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL      s3 = endpoint_url, endpoint_url
//! addressing   ?path_style=    -                                          s3 = addressing_style = path|virtual
//! CA file      ?ca=            AWS_CA_BUNDLE                              ca_bundle
//! profile      ?profile=       AWS_PROFILE                                (else "default")
//! ```
//!
//! Files: `AWS_SHARED_CREDENTIALS_FILE` (default `~/.aws/credentials`,
//! sections `[NAME]`) and `AWS_CONFIG_FILE` (default `~/.aws/config`,
//! sections `[default]` and `[profile NAME]`); a missing file is no error.
//! `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true` ignores endpoints from the
//! environment and the profile. The object_store client reads none of the
//! files itself, so they are parsed here ([`parse_ini`]: sections,
//! `key = value`, `#`/`;` comments, and the indented sub-section of a key
//! with no value, as `s3 =` is written).
//!
//! Without static credentials, an AWS endpoint falls back to the client's
//! own chain (container credentials, web identity, instance metadata),
//! asked once when the client is made (client.rs: finding none is one
//! error that says where to put them); a custom endpoint is that error at
//! once (a local server with no instance metadata would otherwise wait for
//! it to time out). The instance metadata service as the SDKs configure
//! it: `AWS_EC2_METADATA_SERVICE_ENDPOINT` (its URL) and
//! `AWS_EC2_METADATA_DISABLED=true` (not asked: with no container or web
//! identity variables either, the chain has nothing to ask).
//!
//! Secrets are [`Secret`]s: `Debug` and `Display` print `***`.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::url::{S3Url, REDACTED};

/// A secret (access key secret, session token): never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for the client (never for a message).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Static credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The access key id (not secret: printed in messages as AWS does).
    pub key_id: String,
    /// The secret access key.
    pub secret: Secret,
    /// A session token (temporary credentials).
    pub token: Option<Secret>,
    /// Where they were found, for messages: "AWS_ACCESS_KEY_ID",
    /// "profile default in /root/.aws/credentials".
    pub source: String,
}

/// Everything needed to reach one bucket, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Resolved {
    /// Static credentials; None: unsigned, or the client's own chain.
    pub credentials: Option<Credentials>,
    /// Requests unsigned (`?unsigned=1`).
    pub unsigned: bool,
    /// The signing region.
    pub region: String,
    /// The endpoint (None: AWS).
    pub endpoint: Option<String>,
    /// Path-style requests.
    pub path_style: bool,
    /// CA bundle to trust in addition to the system's.
    pub ca: Option<PathBuf>,
    /// The profile read.
    pub profile: String,
    /// The instance metadata service of the credential chain
    /// (`AWS_EC2_METADATA_SERVICE_ENDPOINT`; None: the default,
    /// http://169.254.169.254).
    pub metadata_endpoint: Option<String>,
    /// The credential chain has no source to ask: the instance metadata
    /// service is disabled (`AWS_EC2_METADATA_DISABLED=true`) and no
    /// container or web identity credentials are set.
    pub no_chain: bool,
}

impl Resolved {
    /// Whether the client finds its own credentials (the AWS credential
    /// chain: no static credentials, requests signed).
    pub fn uses_chain(&self) -> bool {
        self.credentials.is_none() && !self.unsigned
    }
}

/// The settings could not be resolved.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
#[non_exhaustive]
pub enum ConfigError {
    /// cannot read the AWS {what} file {path}: {source}
    Read {
        /// "config" or "credentials".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// {path} line {line}: {reason} (the AWS {what} file format: [section] lines, then key = value lines)
    Syntax {
        /// "config" or "credentials".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not: set both, or neither to use a profile
    HalfEnv,
    /// profile '{profile}' has aws_access_key_id but no aws_secret_access_key ({path}): add it
    HalfProfile {
        /// The profile.
        profile: String,
        /// The file.
        path: PathBuf,
    },
    /// no credentials for {endpoint}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, add them to profile '{profile}' of ~/.aws/credentials (or choose a profile with AWS_PROFILE or ?profile=), or add ?unsigned=1 to the URL for a bucket that allows anonymous reads
    NoCredentials {
        /// The endpoint.
        endpoint: String,
        /// The profile looked in.
        profile: String,
    },
    /// {name}={value}: the endpoint must be a URL with its scheme, http://HOST:PORT or https://HOST
    Endpoint {
        /// Where it came from (variable or profile key).
        name: String,
        /// The value.
        value: String,
    },
}

/// One INI file: section name → key → value. A sub-section (`s3 =` then
/// indented lines) is stored as keys `s3.KEY`.
pub type Ini = HashMap<String, HashMap<String, String>>;

/// Parses the AWS config/credentials format.
pub fn parse_ini(text: &str) -> Result<Ini, (usize, &'static str)> {
    let mut out: Ini = HashMap::new();
    let mut section: Option<String> = None;
    let mut sub: Option<String> = None;
    for (n, raw) in text.lines().enumerate() {
        let line_no = n + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        let indented = raw.starts_with([' ', '\t']);
        if let Some(name) = trimmed.strip_prefix('[') {
            let name = name
                .strip_suffix(']')
                .ok_or((line_no, "a section line must end with ']'"))?
                .trim();
            if name.is_empty() {
                return Err((line_no, "empty section name"));
            }
            section = Some(name.split_whitespace().collect::<Vec<_>>().join(" "));
            sub = None;
            out.entry(section.clone().unwrap_or_default()).or_default();
            continue;
        }
        let Some(sec) = &section else {
            return Err((line_no, "a key before the first [section]"));
        };
        let (k, v) = trimmed
            .split_once('=')
            .ok_or((line_no, "expected key = value"))?;
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k.is_empty() {
            return Err((line_no, "empty key"));
        }
        let map = out.entry(sec.clone()).or_default();
        if indented {
            if let Some(s) = &sub {
                map.insert(format!("{s}.{k}"), v.to_string());
                continue;
            }
        }
        if v.is_empty() {
            sub = Some(k);
        } else {
            sub = None;
            map.insert(k, v.to_string());
        }
    }
    Ok(out)
}

/// Where settings come from: the process environment and files, or a
/// given map (tests).
pub trait Env {
    /// A variable, None if unset or empty.
    fn var(&self, name: &str) -> Option<String>;
    /// The home directory.
    fn home(&self) -> Option<PathBuf>;
}

/// The process's environment.
#[derive(Debug, Clone, Copy)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
    fn home(&self) -> Option<PathBuf> {
        self.var("HOME").map(PathBuf::from)
    }
}

fn load(path: &Path, what: &'static str) -> Result<Ini, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(t) => parse_ini(&t).map_err(|(line, reason)| ConfigError::Syntax {
            what,
            path: path.to_path_buf(),
            line,
            reason,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Ini::new()),
        Err(source) => Err(ConfigError::Read {
            what,
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Resolves the settings for `url` from `env` (see the module doc).
pub fn resolve(url: &S3Url, env: &dyn Env) -> Result<Resolved, ConfigError> {
    let profile = url
        .profile
        .clone()
        .or_else(|| env.var("AWS_PROFILE"))
        .unwrap_or_else(|| "default".to_string());
    let aws_dir = env.home().unwrap_or_default().join(".aws");
    let cred_path = env
        .var("AWS_SHARED_CREDENTIALS_FILE")
        .map_or_else(|| aws_dir.join("credentials"), PathBuf::from);
    let conf_path = env
        .var("AWS_CONFIG_FILE")
        .map_or_else(|| aws_dir.join("config"), PathBuf::from);
    let creds_file = load(&cred_path, "credentials")?;
    let conf_file = load(&conf_path, "config")?;
    let conf_section = if profile == "default" {
        "default".to_string()
    } else {
        format!("profile {profile}")
    };
    let empty = HashMap::new();
    let conf = conf_file.get(&conf_section).unwrap_or(&empty);
    let cred = creds_file.get(&profile).unwrap_or(&empty);

    let ignore_endpoints =
        env.var("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS").as_deref() == Some("true");
    let (endpoint, endpoint_from) = match &url.endpoint {
        Some(e) => (Some(e.clone()), "endpoint".to_string()),
        None if ignore_endpoints => (None, String::new()),
        None => {
            let mut found = (None, String::new());
            for name in ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"] {
                if let Some(v) = env.var(name) {
                    found = (Some(v), name.to_string());
                    break;
                }
            }
            if found.0.is_none() {
                for key in ["s3.endpoint_url", "endpoint_url"] {
                    if let Some(v) = conf.get(key) {
                        found = (Some(v.clone()), format!("{key} of profile {profile}"));
                        break;
                    }
                }
            }
            found
        }
    };
    let endpoint = http_url(endpoint, endpoint_from)?;
    let metadata_endpoint = http_url(
        env.var("AWS_EC2_METADATA_SERVICE_ENDPOINT"),
        "AWS_EC2_METADATA_SERVICE_ENDPOINT".to_string(),
    )?;
    let no_chain = env
        .var("AWS_EC2_METADATA_DISABLED")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        && [
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        ]
        .iter()
        .all(|v| env.var(v).is_none());
    let region = url
        .region
        .clone()
        .or_else(|| env.var("AWS_REGION"))
        .or_else(|| env.var("AWS_DEFAULT_REGION"))
        .or_else(|| conf.get("region").cloned())
        .unwrap_or_else(|| "us-east-1".to_string());
    let path_style = url.path_style.unwrap_or_else(|| {
        match conf.get("s3.addressing_style").map(String::as_str) {
            Some("path") => true,
            Some("virtual") => false,
            _ => endpoint.is_some(),
        }
    });
    let ca = url
        .ca
        .clone()
        .or_else(|| env.var("AWS_CA_BUNDLE").map(PathBuf::from))
        .or_else(|| conf.get("ca_bundle").map(PathBuf::from));

    let credentials = if url.unsigned {
        None
    } else if let Some(key_id) = env.var("AWS_ACCESS_KEY_ID") {
        let secret = env
            .var("AWS_SECRET_ACCESS_KEY")
            .ok_or(ConfigError::HalfEnv)?;
        Some(Credentials {
            key_id,
            secret: Secret(secret),
            token: env.var("AWS_SESSION_TOKEN").map(Secret),
            source: "AWS_ACCESS_KEY_ID".to_string(),
        })
    } else {
        // The credentials file first, then the config file.
        let mut found = None;
        for (map, path) in [(cred, &cred_path), (conf, &conf_path)] {
            if let Some(key_id) = map.get("aws_access_key_id") {
                let secret =
                    map.get("aws_secret_access_key")
                        .ok_or_else(|| ConfigError::HalfProfile {
                            profile: profile.clone(),
                            path: path.clone(),
                        })?;
                found = Some(Credentials {
                    key_id: key_id.clone(),
                    secret: Secret(secret.clone()),
                    token: map.get("aws_session_token").cloned().map(Secret),
                    source: format!("profile {profile} in {}", path.display()),
                });
                break;
            }
        }
        found
    };
    if credentials.is_none() && !url.unsigned {
        if let Some(e) = &endpoint {
            return Err(ConfigError::NoCredentials {
                endpoint: e.clone(),
                profile,
            });
        }
    }
    Ok(Resolved {
        credentials,
        unsigned: url.unsigned,
        region,
        endpoint,
        path_style,
        ca,
        profile,
        metadata_endpoint,
        no_chain,
    })
}

/// An endpoint URL from `name` (a variable or a profile key), its trailing
/// `/` dropped; one without its scheme is refused.
fn http_url(value: Option<String>, name: String) -> Result<Option<String>, ConfigError> {
    match value {
        Some(e) if !(e.starts_with("http://") || e.starts_with("https://")) => {
            Err(ConfigError::Endpoint {
                name,
                value: crate::url::redact(&e),
            })
        }
        e => Ok(e.map(|e| e.trim_end_matches('/').to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct MapEnv(HashMap<&'static str, String>, PathBuf);
    impl Env for MapEnv {
        fn var(&self, name: &str) -> Option<String> {
            self.0.get(name).cloned()
        }
        fn home(&self) -> Option<PathBuf> {
            Some(self.1.clone())
        }
    }

    fn env(dir: &Path, vars: &[(&'static str, &str)]) -> MapEnv {
        MapEnv(
            vars.iter().map(|(k, v)| (*k, v.to_string())).collect(),
            dir.to_path_buf(),
        )
    }

    fn files(dir: &Path, creds: &str, conf: &str) {
        std::fs::create_dir_all(dir.join(".aws")).unwrap();
        std::fs::write(dir.join(".aws/credentials"), creds).unwrap();
        std::fs::write(dir.join(".aws/config"), conf).unwrap();
    }

    const CREDS: &str = "\
# a comment
[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key = secret-default

[work]
aws_access_key_id=AKIDWORK
aws_secret_access_key=secret-work
aws_session_token = tok-work
";
    const CONF: &str = "\
[default]
region = eu-central-1
; another comment
[profile work]
region = ap-south-1
s3 =
  endpoint_url = http://127.0.0.1:9000
  addressing_style = virtual
[profile local]
endpoint_url = https://minio.local:9000/
aws_access_key_id = AKIDLOCAL
aws_secret_access_key = secret-local
ca_bundle = /etc/ca.pem
";

    fn url(s: &str) -> S3Url {
        s.parse().unwrap()
    }

    #[test]
    fn the_ini_format_has_sections_keys_comments_and_sub_sections() {
        let ini = parse_ini(CONF).unwrap();
        assert_eq!(ini["default"]["region"], "eu-central-1");
        assert_eq!(
            ini["profile work"]["s3.endpoint_url"],
            "http://127.0.0.1:9000"
        );
        assert_eq!(ini["profile work"]["s3.addressing_style"], "virtual");
        assert!(!ini["profile work"].contains_key("s3"));
        assert_eq!(
            ini["profile local"]["endpoint_url"],
            "https://minio.local:9000/"
        );
        assert_eq!(
            parse_ini("k = v").unwrap_err(),
            (1, "a key before the first [section]")
        );
        assert_eq!(parse_ini("[a\nk=v").unwrap_err().0, 1);
        assert_eq!(
            parse_ini("[a]\nnovalue").unwrap_err(),
            (2, "expected key = value")
        );
        assert!(parse_ini("").unwrap().is_empty());
    }

    #[test]
    fn the_environment_comes_before_the_profile_and_the_url_before_both() {
        let d = tempfile::tempdir().unwrap();
        files(d.path(), CREDS, CONF);
        // The default profile.
        let r = resolve(&url("s3://bkt/k"), &env(d.path(), &[])).unwrap();
        let c = r.credentials.clone().unwrap();
        assert_eq!(c.key_id, "AKIDDEFAULT");
        assert_eq!(c.secret.expose(), "secret-default");
        assert!(c.source.contains("profile default"), "{}", c.source);
        assert_eq!(r.region, "eu-central-1");
        assert_eq!(r.endpoint, None);
        assert!(!r.path_style, "AWS: virtual-hosted");
        // Environment over profile.
        let e = env(
            d.path(),
            &[
                ("AWS_ACCESS_KEY_ID", "AKIDENV"),
                ("AWS_SECRET_ACCESS_KEY", "secret-env"),
                ("AWS_SESSION_TOKEN", "tok-env"),
                ("AWS_REGION", "us-west-2"),
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:8333"),
            ],
        );
        let r = resolve(&url("s3://bkt/k"), &e).unwrap();
        let c = r.credentials.unwrap();
        assert_eq!(
            (c.key_id.as_str(), c.secret.expose()),
            ("AKIDENV", "secret-env")
        );
        assert_eq!(c.token.unwrap().expose(), "tok-env");
        assert_eq!(r.region, "us-west-2");
        assert_eq!(r.endpoint.as_deref(), Some("http://127.0.0.1:8333"));
        assert!(r.path_style, "a custom endpoint: path-style");
        // URL over environment.
        let r = resolve(
            &url("s3://bkt/k?region=sa-east-1&endpoint=http://h:1&path_style=0"),
            &e,
        )
        .unwrap();
        assert_eq!(r.region, "sa-east-1");
        assert_eq!(r.endpoint.as_deref(), Some("http://h:1"));
        assert!(!r.path_style);
        // A named profile: its sub-section, session token and region.
        let r = resolve(
            &url("s3://bkt/k"),
            &env(d.path(), &[("AWS_PROFILE", "work")]),
        )
        .unwrap();
        let c = r.credentials.unwrap();
        assert_eq!(c.key_id, "AKIDWORK");
        assert_eq!(c.token.unwrap().expose(), "tok-work");
        assert_eq!(r.region, "ap-south-1");
        assert_eq!(r.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert!(!r.path_style, "addressing_style = virtual");
        // Credentials and endpoint in the config file, ?profile= choosing it.
        let r = resolve(&url("s3://bkt/k?profile=local"), &env(d.path(), &[])).unwrap();
        assert_eq!(r.credentials.unwrap().key_id, "AKIDLOCAL");
        assert_eq!(r.endpoint.as_deref(), Some("https://minio.local:9000"));
        assert_eq!(r.ca, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(r.region, "us-east-1");
        // Endpoints from the environment and profile can be ignored.
        let r = resolve(
            &url("s3://bkt/k?profile=local"),
            &env(d.path(), &[("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")]),
        )
        .unwrap();
        assert_eq!(r.endpoint, None);
        // Other file locations.
        let alt = d.path().join("alt");
        std::fs::write(
            &alt,
            "[default]\naws_access_key_id=A2\naws_secret_access_key=S2\n",
        )
        .unwrap();
        let r = resolve(
            &url("s3://bkt/k"),
            &env(
                d.path(),
                &[("AWS_SHARED_CREDENTIALS_FILE", alt.to_str().unwrap())],
            ),
        )
        .unwrap();
        assert_eq!(r.credentials.unwrap().key_id, "A2");
    }

    #[test]
    fn missing_or_half_credentials_say_what_to_set() {
        let d = tempfile::tempdir().unwrap();
        // No files at all: AWS falls back to the client's chain ...
        let r = resolve(&url("s3://bkt/k"), &env(d.path(), &[])).unwrap();
        assert!(r.credentials.is_none());
        // ... a custom endpoint is an error naming what to set.
        let e = resolve(&url("s3://bkt/k?endpoint=http://h:1"), &env(d.path(), &[])).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, ConfigError::NoCredentials { .. }), "{msg}");
        assert!(
            msg.contains("AWS_ACCESS_KEY_ID") && msg.contains("?unsigned=1"),
            "{msg}"
        );
        // Unsigned needs nothing.
        let r = resolve(
            &url("s3://bkt/k?endpoint=http://h:1&unsigned=1"),
            &env(d.path(), &[]),
        )
        .unwrap();
        assert!(r.unsigned && r.credentials.is_none());
        let e = resolve(
            &url("s3://bkt/k"),
            &env(d.path(), &[("AWS_ACCESS_KEY_ID", "A")]),
        )
        .unwrap_err();
        assert!(matches!(e, ConfigError::HalfEnv), "{e}");
        files(d.path(), "[default]\naws_access_key_id = A\n", "");
        let e = resolve(&url("s3://bkt/k"), &env(d.path(), &[])).unwrap_err();
        assert!(e.to_string().contains("no aws_secret_access_key"), "{e}");
        files(d.path(), "[default\n", "");
        let e = resolve(&url("s3://bkt/k"), &env(d.path(), &[])).unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
        let e = resolve(
            &url("s3://bkt/k"),
            &env(
                d.path(),
                &[
                    ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"),
                    ("AWS_ENDPOINT_URL", "h:1"),
                ],
            ),
        )
        .unwrap_err();
        assert!(matches!(e, ConfigError::Endpoint { .. }), "{e}");
    }

    #[test]
    fn secrets_never_print() {
        let d = tempfile::tempdir().unwrap();
        files(d.path(), CREDS, CONF);
        let r = resolve(&url("s3://bkt/k?profile=work"), &env(d.path(), &[])).unwrap();
        let shown = format!("{r:?}");
        assert!(
            !shown.contains("secret-work") && !shown.contains("tok-work"),
            "{shown}"
        );
        assert!(shown.contains("***"), "{shown}");
        assert_eq!(Secret("x".into()).to_string(), "***");
    }
}
