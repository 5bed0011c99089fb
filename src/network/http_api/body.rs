//! Reading a request body, bounded: at most [`BODY_BYTES_MAX`] bytes (413
//! beyond, refused on `Content-Length` before anything is read). Shared by
//! every resource; it parses nothing.

use super::errors::HttpError;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use serde_json::Value as Json;

/// Largest request body accepted (a compare-and-swap of two values at the
/// hard value bound, base64-encoded, fits); larger is 413.
pub const BODY_BYTES_MAX: usize = 12 << 20;

/// The body, at most [`BODY_BYTES_MAX`] bytes (413 beyond, before reading
/// it when `Content-Length` says so).
pub(super) async fn read_body(headers: &HeaderMap, body: Body) -> Result<Bytes, HttpError> {
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
    axum::body::to_bytes(body, BODY_BYTES_MAX)
        .await
        .map_err(|error| {
            // Only exceeding the limit and a broken connection fail here.
            if std::error::Error::source(&error).is_some_and(|source| {
                source
                    .downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
            }) {
                too_large()
            } else {
                HttpError::invalid(format!("reading the request body: {error}"))
            }
        })
}
