//! A keyed request's fingerprint: what "the same request" means to the
//! proxy. Two requests with one key and equal fingerprints are one logical
//! request (the second is answered from the first's record); another
//! fingerprint under the key is 422 `KEY_CONFLICT`. It owns the one fixed,
//! documented encoding (docs/proxy.md, "Fingerprint"); it must not read
//! anything but the request, nor depend on the time, the tenant or the
//! proxy instance, so that every proxy computes the same bytes.

use http::{HeaderMap, HeaderName, Method, Uri};

/// What the fingerprint's bytes start with: the encoding's name and
/// version (a new encoding takes a new one, and conflicts with the old).
pub const FINGERPRINT_PREFIX: &[u8] = b"oncekv-proxy-fp1:";

/// The fingerprint's size: the prefix and a 32-byte hash, well within
/// what a claim's fingerprint may be on the wire.
pub const FINGERPRINT_BYTES: usize = FINGERPRINT_PREFIX.len() + 32;
const _: () =
    assert!(FINGERPRINT_BYTES as u64 <= oncekv_wire::convert::CLAIM_FINGERPRINT_BYTES_MAX);

/// The fingerprint of a request: [`FINGERPRINT_PREFIX`] then the 32-byte
/// BLAKE3 hash (in `derive_key` mode, context `oncekv proxy request
/// fingerprint v1`) of, each field as an 8-byte little-endian length then
/// its bytes:
///
/// 1. the method (`POST`);
/// 2. the path as received, still percent-encoded (`/orders/42`);
/// 3. `?` and the query as received when there is one (`/a?` and `/a`
///    differ), else nothing;
/// 4. for each header of `named` (`--fingerprint-header`, in the order
///    given): its lower-case name, then the number of its values as a
///    field of 8 bytes, then each value in the order received (absent and
///    empty differ);
/// 5. the BLAKE3 hash of the body (32 bytes).
///
/// The `Idempotency-Key` (it names the request) and the tenant header (it
/// scopes the key) are not part of it.
pub fn fingerprint(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    named: &[HeaderName],
    body: &[u8],
) -> Vec<u8> {
    let mut hasher = blake3::Hasher::new_derive_key("oncekv proxy request fingerprint v1");
    let mut field = |bytes: &[u8]| {
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    field(method.as_str().as_bytes());
    field(uri.path().as_bytes());
    match uri.query() {
        Some(query) => field(format!("?{query}").as_bytes()),
        None => field(b""),
    }
    for name in named {
        field(name.as_str().as_bytes());
        let values: Vec<&[u8]> = headers
            .get_all(name)
            .iter()
            .map(|value| value.as_bytes())
            .collect();
        field(&(values.len() as u64).to_le_bytes());
        for value in values {
            field(value);
        }
    }
    field(blake3::hash(body).as_bytes());
    [FINGERPRINT_PREFIX, hasher.finalize().as_bytes()].concat()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn of(
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        named: &[&str],
        body: &[u8],
    ) -> Vec<u8> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        let named: Vec<HeaderName> = named
            .iter()
            .map(|name| HeaderName::from_bytes(name.as_bytes()).unwrap())
            .collect();
        fingerprint(
            &method.parse().unwrap(),
            &uri.parse().unwrap(),
            &map,
            &named,
            body,
        )
    }

    /// Method, path, query, body and the named headers each change it;
    /// other headers do not.
    #[test]
    fn every_part_counts_and_nothing_else() {
        let base = of("POST", "/a?x=1", &[("x-user", "7")], &["x-user"], b"{}");
        assert_eq!(base.len(), FINGERPRINT_BYTES);
        assert_eq!(
            base,
            of(
                "POST",
                "/a?x=1",
                &[("x-user", "7"), ("accept", "*/*")],
                &["x-user"],
                b"{}"
            )
        );
        for other in [
            of("PATCH", "/a?x=1", &[("x-user", "7")], &["x-user"], b"{}"),
            of("POST", "/b?x=1", &[("x-user", "7")], &["x-user"], b"{}"),
            of("POST", "/a?x=2", &[("x-user", "7")], &["x-user"], b"{}"),
            of("POST", "/a", &[("x-user", "7")], &["x-user"], b"{}"),
            of("POST", "/a?x=1", &[("x-user", "8")], &["x-user"], b"{}"),
            of("POST", "/a?x=1", &[], &["x-user"], b"{}"),
            of("POST", "/a?x=1", &[("x-user", "7")], &["x-user"], b"{ }"),
        ] {
            assert_ne!(base, other);
        }
        // Absent, empty and two values are three fingerprints; a query of
        // nothing is not no query.
        assert_ne!(
            of("POST", "/a", &[], &["h"], b""),
            of("POST", "/a", &[("h", "")], &["h"], b"")
        );
        assert_ne!(
            of("POST", "/a", &[("h", "ab")], &["h"], b""),
            of("POST", "/a", &[("h", "a"), ("h", "b")], &["h"], b"")
        );
        assert_ne!(
            of("POST", "/a?", &[], &[], b""),
            of("POST", "/a", &[], &[], b"")
        );
    }
}
