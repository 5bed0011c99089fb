//! The request's idempotency key: the `Idempotency-Key` header parsed (a
//! structured-field string or, leniently, a bare token, as the node's
//! HTTP API reads it), the tenant of `--key-scope header:NAME`, and the
//! claim key the two become in the cluster. It owns the claim keys'
//! layout, so that no two (tenant, key) pairs and no scoped and unscoped
//! key can ever name the same claim; it must not decide anything about
//! holding a key (the cluster does).

use http::{HeaderMap, HeaderName};

/// The request header naming a request (the IETF draft's).
pub const IDEMPOTENCY_KEY: &str = oncekv_wire::idempotency_header::IDEMPOTENCY_KEY_HEADER;
/// Longest key accepted, in bytes (the node's HTTP API's bound too).
pub const KEY_BYTES_MAX: usize = oncekv_wire::idempotency_header::IDEMPOTENCY_KEY_HEADER_BYTES_MAX;
/// Longest tenant header value accepted, in bytes.
pub const TENANT_BYTES_MAX: usize = 255;
/// Claim keys longer than this are stored by their BLAKE3 hash instead
/// (64 hex digits), so that a long key and tenant stay under the
/// cluster's `claim_key_bytes_max` (256 by default).
pub const CLAIM_KEY_PLAIN_BYTES_MAX: usize = 200;

/// The key of `headers`' `Idempotency-Key`, `None` without one; a
/// malformed one (given twice, empty, longer than [`KEY_BYTES_MAX`], not
/// printable ASCII, a bad string) is an error saying why — read as the
/// node's HTTP API reads it (`oncekv_wire::idempotency_header`).
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<Vec<u8>>, String> {
    oncekv_wire::idempotency_header::idempotency_key(headers)
}

/// The tenant a keyed request names in header `name` (`--key-scope
/// header:NAME`): its value's bytes. Missing, given twice, empty or longer
/// than [`TENANT_BYTES_MAX`] is an error saying why.
pub fn tenant(headers: &HeaderMap, name: &HeaderName) -> Result<Vec<u8>, String> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Err(format!(
            "a request with an Idempotency-Key needs the {name} header here (keys are scoped by it)"
        ));
    };
    if values.next().is_some() {
        return Err(format!("the {name} header is given more than once"));
    }
    let bytes = value.as_bytes();
    if bytes.is_empty() {
        return Err(format!("the {name} header is empty"));
    }
    if bytes.len() > TENANT_BYTES_MAX {
        return Err(format!(
            "the {name} header has {} bytes, at most {TENANT_BYTES_MAX}",
            bytes.len()
        ));
    }
    Ok(bytes.to_vec())
}

/// The claim key of `key` for a request of `caller` (`--callers-file`)
/// and `tenant` (`--key-scope`): without a caller, [`claim_key`]; with
/// one, `idem-c:`, the caller's name and the tenant (empty without
/// `--key-scope`), each length-prefixed, then the key (hashed as in
/// [`claim_key`] when long, under `idem-c#`). The prefix keeps a caller's
/// keys apart from every key of a proxy without callers, whatever a
/// tenant header says.
pub fn caller_claim_key(caller: Option<&str>, tenant: Option<&[u8]>, key: &[u8]) -> Vec<u8> {
    let Some(caller) = caller else {
        return claim_key(tenant, key);
    };
    let tenant = tenant.unwrap_or_default();
    let plain = [
        b"idem-c:".as_slice(),
        caller.len().to_string().as_bytes(),
        b":",
        caller.as_bytes(),
        tenant.len().to_string().as_bytes(),
        b":",
        tenant,
        key,
    ]
    .concat();
    bounded(plain, b"idem-c#")
}

/// `plain`, or beyond [`CLAIM_KEY_PLAIN_BYTES_MAX`] bytes `hashed_prefix`
/// and the hex BLAKE3 of it.
fn bounded(plain: Vec<u8>, hashed_prefix: &[u8]) -> Vec<u8> {
    if plain.len() <= CLAIM_KEY_PLAIN_BYTES_MAX {
        return plain;
    }
    let hash = blake3::hash(&plain);
    [hashed_prefix, hash.to_hex().as_bytes()].concat()
}

/// The claim key of `key`, scoped by `tenant` when the proxy scopes keys.
///
/// - unscoped: `idem:` then the key;
/// - scoped: `idem-t:`, the tenant's length in decimal, `:`, the tenant,
///   then the key — the length makes (`a:b`, `c`) and (`a`, `b:c`) two
///   claim keys.
///
/// Beyond [`CLAIM_KEY_PLAIN_BYTES_MAX`] bytes the same layout is hashed:
/// `idem#` or `idem-t#` then 64 hex digits of the BLAKE3 of the plain
/// claim key. The fifth byte (`:`, `#` or `-`) and the seventh (`:` or
/// `#`) tell the four forms apart, so no form can spell another's key.
/// The proxy's principal (its token or certificate) scopes every claim
/// key again in the cluster (rule 19).
pub fn claim_key(tenant: Option<&[u8]>, key: &[u8]) -> Vec<u8> {
    let (plain, hashed_prefix): (Vec<u8>, &[u8]) = match tenant {
        None => ([b"idem:".as_slice(), key].concat(), b"idem#"),
        Some(tenant) => (
            [
                b"idem-t:".as_slice(),
                tenant.len().to_string().as_bytes(),
                b":",
                tenant,
                key,
            ]
            .concat(),
            b"idem-t#",
        ),
    };
    bounded(plain, hashed_prefix)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        map
    }

    /// A bare token and the same key as a string are one key; escapes,
    /// emptiness, repeats, length and non-ASCII are judged as the node does.
    #[test]
    fn keys_are_parsed_leniently_and_bounded() {
        let key = |value: &[u8]| idempotency_key(&headers(&[("idempotency-key", value)]));
        assert_eq!(key(b"k1").unwrap(), Some(b"k1".to_vec()));
        assert_eq!(key(b"\"k1\"").unwrap(), Some(b"k1".to_vec()));
        assert_eq!(key(b"\"a \\\"b\\\\\"").unwrap(), Some(b"a \"b\\".to_vec()));
        assert_eq!(idempotency_key(&HeaderMap::new()).unwrap(), None);
        for bad in [&b"\"\""[..], b"\"open", b"a b", b"\"a\\x\"", b"\xff"] {
            assert!(key(bad).is_err(), "{bad:?}");
        }
        assert!(key(&[b'a'; KEY_BYTES_MAX]).is_ok());
        assert!(key(&[b'a'; KEY_BYTES_MAX + 1]).is_err());
        assert!(
            idempotency_key(&headers(&[
                ("idempotency-key", b"a"),
                ("idempotency-key", b"a")
            ]))
            .is_err()
        );
    }

    /// Tenants cannot collide with each other or with unscoped keys, and
    /// long claim keys are hashed into a bounded, distinct form.
    #[test]
    fn claim_keys_never_collide() {
        assert_eq!(claim_key(None, b"k1"), b"idem:k1");
        assert_eq!(claim_key(Some(b"acme"), b"k1"), b"idem-t:4:acmek1");
        assert_ne!(claim_key(Some(b"a:b"), b"c"), claim_key(Some(b"a"), b"b:c"));
        assert_ne!(claim_key(Some(b"ab"), b"c"), claim_key(Some(b"a"), b"bc"));
        // An unscoped key spelling a scoped one's layout stays distinct.
        assert_ne!(
            claim_key(None, b"-t:4:acmek1"),
            claim_key(Some(b"acme"), b"k1")
        );
        let long = [b'x'; KEY_BYTES_MAX];
        let hashed = claim_key(None, &long);
        assert!(hashed.starts_with(b"idem#") && hashed.len() == 5 + 64);
        let scoped = claim_key(Some(&[b't'; TENANT_BYTES_MAX]), &long);
        assert!(scoped.starts_with(b"idem-t#") && scoped.len() == 7 + 64);
        assert_ne!(claim_key(Some(b"t"), &long), claim_key(Some(b"u"), &long));
        // A caller's keys: apart from other callers', from tenants' and
        // from unscoped keys, whatever the names.
        assert_eq!(
            caller_claim_key(None, Some(b"acme"), b"k1"),
            claim_key(Some(b"acme"), b"k1")
        );
        assert_eq!(
            caller_claim_key(Some("acme"), None, b"k1"),
            b"idem-c:4:acme0:k1"
        );
        assert_eq!(
            caller_claim_key(Some("acme"), Some(b"eu"), b"k1"),
            b"idem-c:4:acme2:euk1"
        );
        assert_ne!(
            caller_claim_key(Some("ab"), None, b"c"),
            caller_claim_key(Some("a"), None, b"bc")
        );
        assert_ne!(
            caller_claim_key(Some("a"), Some(b"b"), b"c"),
            caller_claim_key(Some("a"), None, b"bc")
        );
        assert_ne!(
            caller_claim_key(Some("acme"), None, b"k1"),
            claim_key(Some(b"acme"), b"k1")
        );
        let hashed = caller_claim_key(Some("acme"), None, &long);
        assert!(hashed.starts_with(b"idem-c#"));
        assert_ne!(hashed, caller_claim_key(Some("acmf"), None, &long));
    }

    /// The tenant header must be there once, non-empty and bounded.
    #[test]
    fn tenants_are_checked() {
        let name = HeaderName::from_static("x-tenant");
        assert_eq!(
            tenant(&headers(&[("x-tenant", b"acme")]), &name).unwrap(),
            b"acme"
        );
        assert!(tenant(&HeaderMap::new(), &name).is_err());
        assert!(tenant(&headers(&[("x-tenant", b"")]), &name).is_err());
        assert!(tenant(&headers(&[("x-tenant", b"a"), ("x-tenant", b"b")]), &name).is_err());
        assert!(
            tenant(
                &headers(&[("x-tenant", &[b'a'; TENANT_BYTES_MAX + 1])]),
                &name
            )
            .is_err()
        );
    }
}
