//! Reading a request body, bounded three ways: in size (at most
//! [`BODY_BYTES_MAX`] bytes, 413 beyond — refused on `Content-Length`
//! before anything is read), in time (the whole body within the node's
//! body deadline from when reading starts, 408 after it) and in memory
//! (every byte held counts against the node's body buffer, shared by all
//! requests, until the request ends; 503 past it). Bytes are counted as
//! they arrive, never as declared, so a slow or lying client holds only
//! what it has sent. Shared by every resource; it parses nothing.

use super::errors::HttpError;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use http_body_util::BodyExt as _;
use serde_json::Value as Json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Largest request body accepted (a compare-and-swap of two values at the
/// hard value bound, base64-encoded, fits); larger is 413.
pub const BODY_BYTES_MAX: usize = 12 << 20;

/// The node's body buffer: the bytes of request bodies held at once, all
/// requests together.
#[derive(Clone)]
pub(super) struct BodyBuffer {
    bytes: Arc<Semaphore>,
    max: usize,
}

/// A body's bytes and their place in the buffer, given back when dropped.
pub(super) struct HeldBody {
    pub bytes: Bytes,
    _held: Option<OwnedSemaphorePermit>,
}

impl HeldBody {
    /// No body (a call that does not read one).
    pub(super) fn empty() -> HeldBody {
        HeldBody {
            bytes: Bytes::new(),
            _held: None,
        }
    }
}

impl BodyBuffer {
    /// A buffer of `max` bytes (at most `Semaphore::MAX_PERMITS`).
    pub(super) fn new(max: usize) -> BodyBuffer {
        let max = max.min(Semaphore::MAX_PERMITS);
        BodyBuffer {
            bytes: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// Room for `bytes` more, or the refusal.
    fn take(&self, bytes: usize) -> Result<OwnedSemaphorePermit, HttpError> {
        u32::try_from(bytes)
            .ok()
            .and_then(|bytes| self.bytes.clone().try_acquire_many_owned(bytes).ok())
            .ok_or_else(|| {
                HttpError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "UNAVAILABLE",
                    format!(
                        "this node holds its most bytes of HTTP request bodies ({}, \
                         --http-body-buffer-bytes-max); nothing was executed, try again later",
                        self.max
                    ),
                )
                .with("http_body_buffer_bytes_max", Json::from(self.max))
            })
    }
}

/// The body, whole, within `timeout` from now, at most [`BODY_BYTES_MAX`]
/// bytes, its bytes held in `buffer` until the returned body is dropped.
pub(super) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    buffer: &BodyBuffer,
    timeout: Duration,
) -> Result<HeldBody, HttpError> {
    let too_large = || {
        HttpError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "INVALID_ARGUMENT",
            format!("the request body is larger than {BODY_BYTES_MAX} bytes"),
        )
        .with("body_bytes_max", Json::from(BODY_BYTES_MAX))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > BODY_BYTES_MAX as u64) {
        return Err(too_large());
    }
    let too_slow = || {
        let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        HttpError::new(
            StatusCode::REQUEST_TIMEOUT,
            "UNAVAILABLE",
            format!(
                "the request body did not arrive within {millis} ms \
                 (--http-body-timeout-ms); nothing was executed"
            ),
        )
        .with("http_body_timeout_ms", Json::from(millis))
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let mut body = body;
    // Grown as bytes arrive, never to the declared length up front.
    let mut bytes = Vec::new();
    let mut held: Option<OwnedSemaphorePermit> = None;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(too_slow()),
            Ok(None) => break,
            Ok(Some(Err(error))) => {
                return Err(HttpError::invalid(format!(
                    "reading the request body: {error}"
                )));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        // Trailers carry nothing the API reads.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if bytes.len() + data.len() > BODY_BYTES_MAX {
            return Err(too_large());
        }
        let more = buffer.take(data.len())?;
        match &mut held {
            Some(held) => held.merge(more),
            None => held = Some(more),
        }
        bytes.extend_from_slice(&data);
    }
    Ok(HeldBody {
        bytes: Bytes::from(bytes),
        _held: held,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(length: usize) -> HeaderMap {
        super::super::test_headers(&[("content-length", length.to_string().as_bytes())])
    }

    /// A body is read whole and its bytes held in the buffer until it is
    /// dropped; one that does not fit in what is left is 503 and holds
    /// nothing; one declared larger than the largest is 413 unread.
    #[tokio::test]
    async fn bodies_are_held_in_the_buffer() {
        let buffer = BodyBuffer::new(10);
        let timeout = Duration::from_secs(5);
        let first = read_body(&declared(6), Body::from("012345"), &buffer, timeout)
            .await
            .unwrap();
        assert_eq!(&first.bytes[..], b"012345");
        assert_eq!(buffer.bytes.available_permits(), 4);
        let refused = read_body(&declared(5), Body::from("01234"), &buffer, timeout)
            .await
            .err()
            .unwrap();
        assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.body()["http_body_buffer_bytes_max"], 10);
        assert_eq!(buffer.bytes.available_permits(), 4);
        drop(first);
        assert_eq!(buffer.bytes.available_permits(), 10);
        let oversized = read_body(
            &declared(BODY_BYTES_MAX + 1),
            Body::empty(),
            &buffer,
            timeout,
        )
        .await
        .err()
        .unwrap();
        assert_eq!(oversized.status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    /// A body that does not arrive in time is 408, and what it sent is
    /// given back to the buffer.
    #[tokio::test]
    async fn a_slow_body_is_refused_at_the_deadline() {
        use futures::StreamExt as _;
        let buffer = BodyBuffer::new(100);
        let first =
            futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from_static(b"{")) });
        let body = Body::from_stream(first.chain(futures::stream::pending()));
        let started = tokio::time::Instant::now();
        let refused = read_body(&declared(50), body, &buffer, Duration::from_millis(200))
            .await
            .err()
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert_eq!(refused.status, StatusCode::REQUEST_TIMEOUT);
        assert_eq!(refused.body()["http_body_timeout_ms"], 200);
        assert_eq!(buffer.bytes.available_permits(), 100);
    }
}
