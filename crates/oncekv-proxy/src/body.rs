//! Bodies: the one body type the proxy serves and sends ([`ProxyBody`]),
//! a request body read whole within a size bound and a deadline (a keyed
//! request's body must be fingerprinted before anything is forwarded), and
//! an answer's body read up to the recording bound — the rest, if any,
//! streamed on to the caller behind what was read; a request body streamed
//! on tells whether it was the one that broke ([`BodyBroken`]). It owns no
//! policy: the bounds are the caller's.

use http::HeaderMap;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use tokio::time::Instant;

/// Any error a body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every request the proxy sends and every answer it gives.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// `bytes` as a [`ProxyBody`].
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty [`ProxyBody`].
pub fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// A received body (a request's or an upstream answer's), streamed on.
pub fn streamed(body: Incoming) -> ProxyBody {
    body.map_err(BoxError::from).boxed()
}

/// Whether a request body streamed on by [`streamed_watched`] broke off
/// (its connection, or a malformed chunk), and why: told apart from the
/// upstream's failure when the send fails.
#[derive(Clone, Debug, Default)]
pub struct BodyBroken(Arc<OnceLock<String>>);

impl BodyBroken {
    /// Why the body broke off, if it did.
    pub fn why(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }
}

/// A caller's request body, streamed on, recording in `broken` an error
/// of its own (the caller's, not the upstream's).
pub fn streamed_watched(body: Incoming, broken: &BodyBroken) -> ProxyBody {
    let broken = broken.clone();
    body.map_err(move |error| {
        let _ = broken.0.set(error.to_string());
        BoxError::from(error)
    })
    .boxed()
}

/// Why a request body was not read.
#[derive(Debug)]
pub enum ReadError {
    /// Longer than the bound (`Content-Length` says so, or the bytes did).
    TooLarge,
    /// Not all there by the deadline.
    Timeout,
    /// The connection broke, or the body was malformed.
    Broken(String),
}

/// The whole of a request's `body`, at most `limit` bytes, by `deadline`.
/// A `Content-Length` beyond the limit is refused before anything is
/// read; a body without one (chunked) is read until it passes the limit.
pub async fn read_request(
    headers: &HeaderMap,
    body: Incoming,
    limit: usize,
    deadline: Instant,
) -> Result<Bytes, ReadError> {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.trim().parse::<u64>().ok());
    if declared.is_some_and(|declared| declared > limit as u64) {
        return Err(ReadError::TooLarge);
    }
    match read_prefix(body, limit, deadline).await {
        Prefix::Whole(bytes) => Ok(bytes),
        Prefix::TooLarge { .. } => Err(ReadError::TooLarge),
        Prefix::Timeout => Err(ReadError::Timeout),
        Prefix::Broken(error) => Err(ReadError::Broken(error)),
    }
}

/// How much of a body [`read_prefix`] read.
pub enum Prefix {
    /// All of it, within the bound.
    Whole(Bytes),
    /// More than the bound: what was read (at least the bound) and the
    /// unread rest.
    TooLarge { read: Bytes, rest: Incoming },
    /// Not all there by the deadline.
    Timeout,
    /// The body broke off.
    Broken(String),
}

/// Reads `body` until its end or until more than `limit` bytes are read,
/// by `deadline`. Trailers are dropped.
pub async fn read_prefix(mut body: Incoming, limit: usize, deadline: Instant) -> Prefix {
    let mut read: Vec<u8> = Vec::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Prefix::Timeout,
            Ok(None) => return Prefix::Whole(Bytes::from(read)),
            Ok(Some(Err(error))) => return Prefix::Broken(error.to_string()),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            read.extend_from_slice(&data);
            if read.len() > limit {
                return Prefix::TooLarge {
                    read: Bytes::from(read),
                    rest: body,
                };
            }
        }
    }
}

/// A body that yields `first`, then the rest of a received body: an
/// answer too large to record, passed on whole to its first caller.
pub struct Prefixed {
    first: Option<Bytes>,
    rest: Incoming,
}

impl Prefixed {
    /// `first`, then `rest`, as a [`ProxyBody`].
    pub fn boxed_body(first: Bytes, rest: Incoming) -> ProxyBody {
        Prefixed {
            first: Some(first),
            rest,
        }
        .boxed()
    }
}

impl Body for Prefixed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        Pin::new(&mut self.rest)
            .poll_frame(context)
            .map_err(BoxError::from)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.size_hint();
        let first = self.first.as_ref().map_or(0, |first| first.len() as u64);
        // Upper first: a lower bound above the upper one panics.
        let mut hint = SizeHint::new();
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(first));
        }
        hint.set_lower(rest.lower().saturating_add(first));
        hint
    }
}
