//! Decoding Redis replies: the text of a reply, and the error for one that
//! is not what a command answers.
//!
//! Uses: nothing of this crate (the `store` and the `dataset` modules use
//! it).

use std::io;

use redis::Value;

/// The text of a string or integer reply.
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The texts of an array reply (an element that is not text reads as
/// empty), or of a single reply.
pub(crate) fn texts(v: &Value) -> Vec<String> {
    match v {
        Value::Array(a) => a.iter().map(|x| text(x).unwrap_or_default()).collect(),
        v => text(v).into_iter().collect(),
    }
}

/// The error for reply `v`, which `what` does not answer.
pub(crate) fn bad_reply(what: &str, v: &Value) -> io::Error {
    io::Error::other(format!("redis: unexpected reply {v:?} to {what}"))
}
