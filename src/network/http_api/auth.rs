//! Who calls the HTTP API: the caller's bearer token from the
//! `Authorization` header. The token is passed through to the node's own
//! client port with each forwarded call, which authenticates it and checks
//! the principal's role; this module never uses the node's own identity.

use super::errors::HttpError;
use axum::http::{HeaderMap, StatusCode, header};

/// The caller's bearer token (`Authorization: Bearer TOKEN`), if any; a
/// header that is not one is 401 (`UNAUTHENTICATED`).
pub fn bearer_token(headers: &HeaderMap) -> Result<Option<String>, HttpError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let unauthenticated = |why: &str| {
        HttpError::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHENTICATED",
            format!("malformed Authorization header: {why}"),
        )
    };
    let text = value
        .to_str()
        .map_err(|_| unauthenticated("not printable ASCII"))?;
    let (scheme, token) = text
        .trim()
        .split_once(' ')
        .ok_or_else(|| unauthenticated("expected `Bearer TOKEN`"))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(unauthenticated("only the Bearer scheme is accepted"));
    }
    let token = token.trim();
    if token.is_empty() || !token.bytes().all(|byte| byte.is_ascii_graphic()) {
        return Err(unauthenticated("the token must be visible ASCII"));
    }
    Ok(Some(token.to_string()))
}

#[cfg(test)]
mod tests {
    use super::super::test_headers as headers;
    use super::*;

    /// Bearer tokens are passed through as given; other schemes and junk
    /// are 401.
    #[test]
    fn authorization_header() {
        assert_eq!(bearer_token(&headers(&[])), Ok(None));
        assert_eq!(
            bearer_token(&headers(&[("authorization", b"Bearer abc.def")])),
            Ok(Some("abc.def".into()))
        );
        assert_eq!(
            bearer_token(&headers(&[("authorization", b"bearer  abc")])),
            Ok(Some("abc".into()))
        );
        for bad in [&b"Basic abc"[..], b"Bearer", b"Bearer a b", b"abc"] {
            let error = bearer_token(&headers(&[("authorization", bad)]))
                .expect_err(&String::from_utf8_lossy(bad));
            assert_eq!(error.status, StatusCode::UNAUTHORIZED);
            assert_eq!(error.reason, "UNAUTHENTICATED");
        }
    }
}
