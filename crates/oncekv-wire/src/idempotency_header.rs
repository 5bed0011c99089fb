//! The HTTP `Idempotency-Key` header (the IETF draft's), read the same way
//! by every side that takes it — the node's HTTP API and `oncekv proxy`: a
//! structured-field string (`"..."`, RFC 8941) or, leniently, a bare token
//! of visible ASCII, 1 to [`IDEMPOTENCY_KEY_HEADER_BYTES_MAX`] bytes. It
//! parses; it must not decide what a key names (the node scopes keys by
//! principal, the proxy by tenant).

use http::HeaderMap;

/// The request header naming a request.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
/// Most bytes of a key (inside its quotes).
pub const IDEMPOTENCY_KEY_HEADER_BYTES_MAX: usize = 255;

/// The key of `headers`' `Idempotency-Key`, `None` without one; a
/// malformed one (given twice, empty, longer than [`IDEMPOTENCY_KEY_HEADER_BYTES_MAX`], not
/// printable ASCII, a bad string) is an error saying why.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<Vec<u8>>, String> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let malformed = |why: &str| format!("malformed Idempotency-Key header: {why}");
    if values.next().is_some() {
        return Err(malformed("given more than once"));
    }
    let text = value
        .to_str()
        .map_err(|_| malformed("not printable ASCII"))?
        .trim_matches(|c| c == ' ' || c == '\t');
    let key = match text.strip_prefix('"') {
        Some(quoted) => {
            let inner = match closing_quote(quoted) {
                Some(end) if end + 1 == quoted.len() => &quoted[..end],
                Some(_) => {
                    return Err(malformed(
                        "text after the string's closing quote (no parameters are taken)",
                    ));
                }
                None => return Err(malformed("an unterminated string")),
            };
            let mut key = Vec::with_capacity(inner.len());
            let mut bytes = inner.bytes();
            while let Some(byte) = bytes.next() {
                match byte {
                    b'\\' => match bytes.next() {
                        Some(escaped @ (b'"' | b'\\')) => key.push(escaped),
                        _ => return Err(malformed("a bad escape (only \\\" and \\\\)")),
                    },
                    0x20..=0x7e => key.push(byte),
                    _ => return Err(malformed("not printable ASCII")),
                }
            }
            key
        }
        None => {
            if !text
                .bytes()
                .all(|byte| byte.is_ascii_graphic() && byte != b'"')
            {
                return Err(malformed(
                    "quote it as a string (\"...\") or use visible ASCII only",
                ));
            }
            text.as_bytes().to_vec()
        }
    };
    if key.is_empty() {
        return Err(malformed("empty"));
    }
    if key.len() > IDEMPOTENCY_KEY_HEADER_BYTES_MAX {
        return Err(malformed(&format!(
            "{} bytes, at most {IDEMPOTENCY_KEY_HEADER_BYTES_MAX}",
            key.len()
        )));
    }
    Ok(Some(key))
}

/// Where the string that `quoted` continues (its opening quote stripped)
/// ends: the byte index of its first quote not escaped by a backslash.
fn closing_quote(quoted: &str) -> Option<usize> {
    let mut escaped = false;
    for (index, byte) in quoted.bytes().enumerate() {
        match byte {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b'"' => return Some(index),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &str) -> Result<Option<Vec<u8>>, String> {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY_HEADER, value.parse().unwrap());
        idempotency_key(&headers)
    }

    /// A string ends at its first unescaped quote: an escaped quote stays
    /// in the key, and what follows the closing quote is named as such,
    /// not as an unterminated string.
    #[test]
    fn strings_end_at_their_first_unescaped_quote() {
        assert_eq!(key(r#""a\"b""#).unwrap(), Some(br#"a"b"#.to_vec()));
        assert_eq!(key("\"msg-42\"").unwrap(), Some(b"msg-42".to_vec()));
        assert_eq!(key("msg-42").unwrap(), Some(b"msg-42".to_vec()));
        for after in [r#""ab" trailing"#, r#""ab";param=1"#, r#""a"b""#] {
            let error = key(after).unwrap_err();
            assert!(
                error.contains("after the string's closing quote"),
                "{after}: {error}"
            );
        }
        for open in [r#""ab"#, r#""ab\""#] {
            let error = key(open).unwrap_err();
            assert!(error.contains("unterminated"), "{open}: {error}");
        }
        assert!(key(r#""a\x""#).unwrap_err().contains("bad escape"));
    }
}
