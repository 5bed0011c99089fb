//! Who calls the HTTP API: the caller's bearer token from the
//! `Authorization` header, authenticated from the headers alone — on a
//! node with authentication a request without a token of the node's token
//! file is 401 before anything of its body is read or a permit taken. The
//! token is then passed through to the node's own client port with each
//! forwarded call, which authenticates it again (the same live policy, so
//! a reload refuses a removed token on both) and checks the principal's
//! role; this module only refuses early, and never uses the node's own
//! identity.

use super::errors::HttpError;
use crate::network::auth::AuthPolicy;
use axum::http::{HeaderMap, StatusCode, header};

/// The caller's token, authenticated by `policy` (the node's current
/// one): 401 (`UNAUTHENTICATED`) for a malformed `Authorization` header,
/// and on a node with authentication for no token or an unknown one.
pub(super) fn authenticate(
    policy: &AuthPolicy,
    headers: &HeaderMap,
) -> Result<Option<String>, HttpError> {
    let token = bearer_token(headers)?;
    policy
        .token_caller(token.as_deref())
        .map_err(|why| HttpError::new(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", why))?;
    Ok(token)
}

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

    /// On a node with authentication only a token of its file passes (no
    /// token, an unknown one: 401); without authentication anyone does.
    #[test]
    fn callers_are_authenticated_from_the_headers() {
        let policy = AuthPolicy::parse(
            std::path::Path::new("tokens"),
            "0123456789abcdef-alice alice client\n",
            true,
        )
        .unwrap();
        let alice = headers(&[("authorization", b"Bearer 0123456789abcdef-alice")]);
        assert_eq!(
            authenticate(&policy, &alice),
            Ok(Some("0123456789abcdef-alice".into()))
        );
        for refused in [
            headers(&[]),
            headers(&[("authorization", b"Bearer 0123456789abcdef-bob")]),
        ] {
            let error = authenticate(&policy, &refused).unwrap_err();
            assert_eq!(
                (error.status, error.reason),
                (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED")
            );
        }
        assert_eq!(authenticate(&AuthPolicy::off(), &headers(&[])), Ok(None));
    }
}
