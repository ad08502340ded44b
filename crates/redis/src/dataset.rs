//! Datasets as a whole: visible only once complete, listed, deleted.
//!
//! Contract:
//! 1. **A dataset is visible only once complete.** Its metadata hash
//!    `upager:{NAME}:meta` (what [`RedisStore::open`] reads) appears in one
//!    atomic step, a `RENAME` of the upload's own hash `upager:{NAME}:upload`
//!    (same hash tag, same slot) after the last chunk was acknowledged. An
//!    upload that stops half-way leaves no metadata: opening the name fails
//!    ("incomplete upload"), it never reads as zeros.
//! 2. **One writer per name.** The upload hash holds `owner` (a token of
//!    the uploader), `beat` (the server's time of its last progress, one
//!    update per batch), `len`, `chunk` and `clear` (chunks to remove
//!    before writing: the largest extent any earlier upload or dataset of
//!    the name had). A load claims the name with a script that refuses an
//!    existing dataset, and an upload whose `beat` is younger than
//!    [`STALE_SECS`] (it may be running); an older one is taken over. Each
//!    batch's heartbeat checks `owner`: an uploader that lost the name
//!    (deleted, or taken over) stops.
//! 3. **A new upload starts clean.** Chunks of zeros are not stored (a
//!    missing key reads as zeros), so a leftover chunk of an earlier upload
//!    would show through: the claimer removes chunks `[0, clear)` of the
//!    record it replaces first. A name with no record has no chunks (every
//!    path that writes chunks holds a record, and removes it last), so a
//!    fresh upload removes nothing.
//! 4. **Interrupted uploads are removed, or left invisible.** On an error,
//!    or when the caller's cancel flag is set (the CLI sets it on SIGINT,
//!    SIGTERM, SIGHUP), the uploader removes the chunks it wrote and its
//!    upload hash. A process killed outright (SIGKILL, a crash) leaves them:
//!    [`list`] shows the name as incomplete, [`delete`] removes it, and
//!    `load` of the name again replaces it once its heartbeat is
//!    [`STALE_SECS`] old.
//! 5. **Delete hides first.** [`delete`] renames the metadata back to an
//!    upload hash it owns (the dataset disappears at once), removes the
//!    chunks, then the hash. An interrupted delete leaves an incomplete
//!    dataset, which a second delete finishes.
//!
//! Uses: `reply`, `store` (its keys, its connection and its chunks), `url`.
//! The store never uses this module: creating and deleting a dataset
//! ([`RedisStore::create`], [`RedisStore::delete`]) are defined here.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::Value;

use crate::reply::{bad_reply, text, texts};
use crate::store::{
    meta_key, trace_key, upload_key, OpenError, RedisOptions, RedisStore, StoreError,
};
use crate::url::StoreUrl;

/// An upload whose heartbeat is older than this (seconds) is taken to be
/// dead: a new load of the name replaces it. A guess: a batch (16 MiB)
/// takes well under a second here; a failover stalls one for a few.
pub const STALE_SECS: u64 = 60;

/// Chunks removed per step of a delete (one pipeline per node each).
const DELETE_STEP: u64 = 4096;

/// Claims `KEYS[1]` (upload) unless `KEYS[2]` (meta) exists or a live
/// upload holds it. ARGV: token, len, chunk, stale seconds. Replies
/// `{'ok', clear}` (chunks of a replaced record to remove), `{'exists'}`
/// or `{'busy', age}`.
const CLAIM: &str = r"
local now = tonumber(redis.call('TIME')[1])
if redis.call('EXISTS', KEYS[2]) == 1 then return {'exists'} end
local o = redis.call('HMGET', KEYS[1], 'owner', 'beat', 'len', 'chunk', 'clear')
if o[1] == ARGV[1] then return {'ok', o[5]} end
if o[1] then
  local age = now - (tonumber(o[2]) or 0)
  if age < tonumber(ARGV[4]) then return {'busy', string.format('%d', age)} end
end
local clear = 0
if o[3] and o[4] then clear = math.ceil(tonumber(o[3]) / tonumber(o[4])) end
if o[5] and tonumber(o[5]) > clear then clear = tonumber(o[5]) end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'beat', now, 'len', ARGV[2], 'chunk', ARGV[3],
  'clear', string.format('%d', clear))
return {'ok', string.format('%d', clear)}
";

/// Heartbeat: 1 if `KEYS[1]` is still owned by ARGV[1] (and its beat
/// updated), else 0.
const BEAT: &str = r"
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'beat', redis.call('TIME')[1])
return 1
";

/// Publishes: renames `KEYS[1]` to `KEYS[2]` if ARGV[1] owns it. 1 done
/// (also when a retry finds it done), 0 not the owner, -1 meta exists.
const FINISH: &str = r"
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
  redis.call('HDEL', KEYS[1], 'clear')
  redis.call('HSET', KEYS[1], 'beat', redis.call('TIME')[1])
  redis.call('RENAME', KEYS[1], KEYS[2])
  return 1
end
if redis.call('HGET', KEYS[2], 'owner') == ARGV[1] then return 1 end
return 0
";

/// Removes `KEYS[1]` if ARGV[1] owns it.
const RELEASE: &str = r"
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// Takes a dataset (complete or not) over for deletion: the metadata
/// becomes an upload hash owned by ARGV[1]. Replies `{'none'}` or
/// `{'ok', chunks to remove, len, chunk, was complete}`.
const TAKE_FOR_DELETE: &str = r"
local high = 0
local len, chunk = nil, nil
local complete = 0
for i, k in ipairs(KEYS) do
  local o = redis.call('HMGET', k, 'len', 'chunk', 'clear')
  if o[1] and o[2] then
    local h = math.ceil(tonumber(o[1]) / tonumber(o[2]))
    if h > high then high = h end
    if i == 2 or not len then len, chunk = o[1], o[2] end
    if i == 2 then complete = 1 end
  end
  if o[3] and tonumber(o[3]) > high then high = tonumber(o[3]) end
end
if not len then return {'none'} end
if complete == 1 then
  redis.call('DEL', KEYS[1])
  redis.call('RENAME', KEYS[2], KEYS[1])
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'beat', redis.call('TIME')[1], 'len', len,
  'chunk', chunk, 'clear', string.format('%d', high))
return {'ok', string.format('%d', high), len, chunk, complete}
";

/// A token no other uploader has: pid, time, a counter.
fn token() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{}-{nanos:x}-{}",
        std::process::id(),
        N.fetch_add(1, Relaxed)
    )
}

/// An upload in progress: the claimed name and the store its chunks go to.
pub(crate) struct Upload {
    pub(crate) store: Arc<RedisStore>,
    token: String,
}

impl Upload {
    /// Claims dataset `url` names for an upload of `len` bytes in chunks of
    /// `chunk` bytes and removes any chunk an earlier upload left.
    pub(crate) fn begin(
        url: &StoreUrl,
        len: u64,
        chunk: u64,
        opts: &RedisOptions,
    ) -> Result<Upload, OpenError> {
        let (store, name) = RedisStore::for_dataset(url, len, chunk, opts)?;
        let token = token();
        let redis_err = |source| OpenError::Redis {
            addrs: url.addresses(),
            source,
        };
        let v = store
            .command(
                redis::cmd("EVAL")
                    .arg(CLAIM)
                    .arg(2)
                    .arg(upload_key(&name))
                    .arg(meta_key(&name))
                    .arg(&token)
                    .arg(len)
                    .arg(chunk)
                    .arg(STALE_SECS),
            )
            .map_err(redis_err)?;
        let r = texts(&v);
        let clear = match r.first().map(String::as_str) {
            Some("ok") => r.get(1).and_then(|c| c.parse::<u64>().ok()).unwrap_or(0),
            Some("exists") => {
                return Err(OpenError::Exists {
                    name,
                    addrs: url.addresses(),
                })
            }
            Some("busy") => {
                return Err(OpenError::Busy {
                    name,
                    addrs: url.addresses(),
                    age: r.get(1).cloned().unwrap_or_default(),
                })
            }
            _ => return Err(redis_err(bad_reply("the upload claim", &v))),
        };
        let up = Upload { store, token };
        up.store
            .remove_chunks(0, clear, &mut |_| {})
            .map_err(redis_err)?;
        Ok(up)
    }

    /// Records progress; an error if the name was taken from this upload.
    pub(crate) fn beat(&self) -> io::Result<()> {
        let v = self.script(BEAT, false)?;
        match v {
            Value::Int(1) => Ok(()),
            Value::Int(_) => Err(io::Error::other(format!(
                "the upload of '{}' was taken over by another upager (a delete, or a load that \
                 found it stale)",
                self.store.name()
            ))),
            v => Err(bad_reply("the upload heartbeat", &v)),
        }
    }

    /// Publishes the dataset (contract 1).
    pub(crate) fn finish(&self) -> io::Result<()> {
        match self.script(FINISH, true)? {
            Value::Int(1) => Ok(()),
            Value::Int(-1) => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("dataset '{}' appeared during the upload", self.store.name()),
            )),
            Value::Int(_) => Err(io::Error::other(format!(
                "the upload of '{}' was taken over by another upager before it completed",
                self.store.name()
            ))),
            v => Err(bad_reply("the upload's publication", &v)),
        }
    }

    /// Removes what this upload wrote (if the name is still its own).
    pub(crate) fn abandon(&self, written: u64) -> io::Result<()> {
        self.beat()?;
        self.store.remove_chunks(0, written, &mut |_| {})?;
        self.script(RELEASE, false).map(|_| ())
    }

    fn script(&self, src: &str, with_meta: bool) -> io::Result<Value> {
        let name = self.store.name();
        let mut c = redis::cmd("EVAL");
        c.arg(src)
            .arg(if with_meta { 2 } else { 1 })
            .arg(upload_key(name));
        if with_meta {
            c.arg(meta_key(name));
        }
        c.arg(&self.token);
        self.store.command(&c)
    }
}

/// A dataset on a cluster, as [`list`] and [`delete`] report it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DatasetInfo {
    /// Its name (the URL's /NAME).
    pub name: String,
    /// Bytes.
    pub len: u64,
    /// Chunk size (one key each).
    pub chunk: u64,
    /// Complete (opens), or an upload that is running, was interrupted or
    /// killed, or a delete that was (invisible: `upager delete` removes it).
    pub complete: bool,
    /// Of an incomplete one: seconds since its last progress.
    pub idle_secs: Option<u64>,
}

/// Lists the datasets on the cluster `url` names (its /NAME, if any, is
/// not used), complete and incomplete, sorted by name.
pub fn list(url: &StoreUrl, opts: &RedisOptions) -> Result<Vec<DatasetInfo>, OpenError> {
    let mut u = url.clone();
    u.name = None;
    let (st, _) = RedisStore::for_dataset(&u.with_name("list"), 0, 4096, opts)?;
    let redis_err = |source| OpenError::Redis {
        addrs: url.addresses(),
        source,
    };
    let keys = st.scan_hashes("upager:{*}:*").map_err(redis_err)?;
    let now = st
        .command(&redis::cmd("TIME"))
        .ok()
        .and_then(|v| texts(&v).first().and_then(|s| s.parse::<u64>().ok()));
    let mut out: Vec<DatasetInfo> = Vec::new();
    for key in keys {
        let Some(rest) = key.strip_prefix("upager:{") else {
            continue;
        };
        let Some((name, kind)) = rest.rsplit_once("}:") else {
            continue;
        };
        let complete = match kind {
            "meta" => true,
            "upload" => false,
            _ => continue,
        };
        let v = st
            .command(
                redis::cmd("HMGET")
                    .arg(&key)
                    .arg("len")
                    .arg("chunk")
                    .arg("beat"),
            )
            .map_err(redis_err)?;
        let f = texts(&v);
        let num = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
        let info = DatasetInfo {
            name: name.to_string(),
            len: num(0).unwrap_or(0),
            chunk: num(1).unwrap_or(0),
            complete,
            idle_secs: (!complete)
                .then(|| Some(now?.saturating_sub(num(2)?)))
                .flatten(),
        };
        // A name with both (a delete taking over): incomplete wins.
        match out.iter_mut().find(|d| d.name == info.name) {
            Some(d) if d.complete => *d = info,
            Some(_) => {}
            None => out.push(info),
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Deletes the dataset `url` names, complete or not (contract 5);
/// `progress(done, total)` counts chunks removed. Returns what it was.
pub fn delete(
    url: &StoreUrl,
    opts: &RedisOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<DatasetInfo, StoreError> {
    let name = url.name.clone().ok_or_else(|| StoreError::NoName {
        url: url.to_string(),
    })?;
    let del_err = |source| StoreError::Delete {
        name: name.clone(),
        source,
    };
    let (st, _) = RedisStore::for_dataset(url, u64::MAX, 4096, opts).map_err(StoreError::Open)?;
    let token = token();
    let v = st
        .command(
            redis::cmd("EVAL")
                .arg(TAKE_FOR_DELETE)
                .arg(2)
                .arg(upload_key(&name))
                .arg(meta_key(&name))
                .arg(&token),
        )
        .map_err(del_err)?;
    let r = texts(&v);
    if r.first().map(String::as_str) == Some("none") {
        return Err(StoreError::NotFound {
            name,
            addrs: url.addresses(),
        });
    }
    let num = |i: usize| r.get(i).and_then(|s| s.parse::<u64>().ok());
    let (Some(high), Some(len), Some(chunk), Some(complete)) = (num(1), num(2), num(3), num(4))
    else {
        return Err(del_err(bad_reply("the delete's takeover", &v)));
    };
    let up = Upload { store: st, token };
    progress(0, high);
    let mut first = 0;
    while first < high {
        let end = high.min(first + DELETE_STEP);
        up.store
            .remove_chunks(first, end, &mut |_| {})
            .map_err(del_err)?;
        up.beat().map_err(del_err)?;
        progress(end, high);
        first = end;
    }
    // Its warm-start trace goes with it (before the record: a delete that
    // stops here is finished by the next one).
    up.store
        .command(redis::cmd("UNLINK").arg(trace_key(up.store.name())))
        .map_err(del_err)?;
    up.script(RELEASE, false).map_err(del_err)?;
    Ok(DatasetInfo {
        name,
        len,
        chunk,
        complete: complete == 1,
        idle_secs: None,
    })
}

impl RedisStore {
    /// Creates the empty dataset (all zeros) of `len` bytes in chunks of
    /// `chunk` bytes that the URL names; fails if it exists (or an upload
    /// of it runs). Visible at once, complete: its metadata is published
    /// as an upload's is (see the `dataset` module).
    pub fn create(
        url: &StoreUrl,
        len: u64,
        chunk: u64,
        opts: &RedisOptions,
    ) -> Result<Arc<RedisStore>, OpenError> {
        let up = Upload::begin(url, len, chunk, opts)?;
        up.finish().map_err(|source| OpenError::Redis {
            addrs: url.addresses(),
            source,
        })?;
        Ok(Arc::clone(&up.store))
    }

    /// Removes the dataset: hidden first, then every chunk key, then its
    /// metadata (see [`crate::delete`]); swap space: its keys.
    pub fn delete(self: &Arc<Self>) -> Result<(), StoreError> {
        if self.is_swap() {
            return self.delete_swap();
        }
        delete(&self.dataset_url(), self.options(), &mut |_, _| {}).map(|_| ())
    }

    /// Chunks `[first, end)` of this store's name removed (pipelined per
    /// node); `progress(done)` after each step.
    pub(crate) fn remove_chunks(
        &self,
        first: u64,
        end: u64,
        progress: &mut dyn FnMut(u64),
    ) -> io::Result<()> {
        let mut at = first;
        while at < end {
            let to = end.min(at + DELETE_STEP);
            self.unlink_chunks(at, to)?;
            progress(to);
            at = to;
        }
        Ok(())
    }

    /// SCAN of every master for hashes whose key matches `pattern`.
    fn scan_hashes(&self, pattern: &str) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for (host, port) in self.masters()? {
            let mut cursor = "0".to_string();
            let deadline = std::time::Instant::now() + self.options().retry_for;
            loop {
                let v = self.routed(
                    redis::cmd("SCAN")
                        .arg(&cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("TYPE")
                        .arg("hash")
                        .arg("COUNT")
                        .arg(1000),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port,
                    }),
                    deadline,
                )?;
                let Value::Array(parts) = &v else {
                    return Err(bad_reply("SCAN", &v));
                };
                let (Some(c), Some(keys)) = (parts.first().and_then(text), parts.get(1)) else {
                    return Err(bad_reply("SCAN", &v));
                };
                out.extend(texts(keys));
                cursor = c;
                if cursor == "0" {
                    break;
                }
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}
