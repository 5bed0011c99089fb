//! The recorded answer: what the proxy stores as a claim's result when the
//! upstream's answer is final, and replays byte for byte. It owns the one
//! encoding (versioned; docs/proxy.md, "The record") and its strict
//! decoding — bounds checked, never a panic, whatever bytes the cluster
//! holds under the key; it must not decide what is recorded (that is the
//! request flow's) or talk to anyone.

/// What every record starts with: the format's name and version.
pub const MAGIC: &[u8] = b"okvp1";
/// Flag bit: the body was too large to record; only its size is kept.
const FLAG_BODY_OMITTED: u8 = 1;

/// One recorded answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The upstream's status code.
    pub status: u16,
    /// The allow-listed headers, names in lower case, in the order the
    /// upstream sent them.
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    /// The body, byte for byte (empty when omitted).
    pub body: Vec<u8>,
    /// `Some(size)`: the body (of at least `size` bytes) was larger than
    /// the proxy records, and is not in the record.
    pub body_omitted: Option<u64>,
}

/// Why bytes are not a record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("not a proxy record (no `okvp1` prefix): another writer's result under this key")]
    NotARecord,
    #[error("a truncated or malformed proxy record: {0}")]
    Malformed(&'static str),
}

impl Record {
    /// The encoding: [`MAGIC`]; one byte of flags (bit 0: body omitted;
    /// the others 0); the status as 2 bytes big-endian; the number of
    /// headers as 2 bytes; each header as its name's length (2 bytes), the
    /// name, its value's length (4 bytes), the value; then either the
    /// body, to the end (flag clear), or the omitted body's size as 8
    /// bytes (flag set). Lengths are big-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.encoded_len());
        bytes.extend_from_slice(MAGIC);
        bytes.push(if self.body_omitted.is_some() {
            FLAG_BODY_OMITTED
        } else {
            0
        });
        bytes.extend_from_slice(&self.status.to_be_bytes());
        let headers = u16::try_from(self.headers.len()).unwrap_or(u16::MAX);
        bytes.extend_from_slice(&headers.to_be_bytes());
        for (name, value) in self.headers.iter().take(usize::from(headers)) {
            let name = &name[..name.len().min(usize::from(u16::MAX))];
            let value = &value[..value.len().min(u32::MAX as usize)];
            bytes.extend_from_slice(&(name.len() as u16).to_be_bytes());
            bytes.extend_from_slice(name);
            bytes.extend_from_slice(&(value.len() as u32).to_be_bytes());
            bytes.extend_from_slice(value);
        }
        match self.body_omitted {
            Some(size) => bytes.extend_from_slice(&size.to_be_bytes()),
            None => bytes.extend_from_slice(&self.body),
        }
        bytes
    }

    /// The size of [`Record::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(name, value)| 2 + name.len() + 4 + value.len())
            .sum();
        let body = match self.body_omitted {
            Some(_) => 8,
            None => self.body.len(),
        };
        MAGIC.len() + 1 + 2 + 2 + headers + body
    }

    /// The same answer without its body, of `size` bytes (at least).
    pub fn without_body(&self, size: u64) -> Record {
        Record {
            status: self.status,
            headers: self.headers.clone(),
            body: Vec::new(),
            body_omitted: Some(size),
        }
    }

    /// Decodes [`Record::encode`]'s bytes; anything else is an error.
    pub fn decode(bytes: &[u8]) -> Result<Record, RecordError> {
        let mut rest = bytes.strip_prefix(MAGIC).ok_or(RecordError::NotARecord)?;
        let flags = take::<1>(&mut rest, "flags")?[0];
        if flags & !FLAG_BODY_OMITTED != 0 {
            return Err(RecordError::Malformed("unknown flags"));
        }
        let status = u16::from_be_bytes(take::<2>(&mut rest, "status")?);
        if !(100..=999).contains(&status) {
            return Err(RecordError::Malformed("status out of range"));
        }
        let count = u16::from_be_bytes(take::<2>(&mut rest, "header count")?);
        let mut headers = Vec::with_capacity(usize::from(count).min(rest.len() / 6));
        for _ in 0..count {
            let name_len = u16::from_be_bytes(take::<2>(&mut rest, "header name length")?);
            let name = take_slice(&mut rest, usize::from(name_len), "header name")?;
            let value_len = u32::from_be_bytes(take::<4>(&mut rest, "header value length")?);
            let value_len =
                usize::try_from(value_len).map_err(|_| RecordError::Malformed("header value"))?;
            let value = take_slice(&mut rest, value_len, "header value")?;
            headers.push((name.to_vec(), value.to_vec()));
        }
        let (body, body_omitted) = if flags & FLAG_BODY_OMITTED != 0 {
            let size = u64::from_be_bytes(take::<8>(&mut rest, "omitted body size")?);
            if !rest.is_empty() {
                return Err(RecordError::Malformed(
                    "bytes after the omitted body's size",
                ));
            }
            (Vec::new(), Some(size))
        } else {
            (rest.to_vec(), None)
        };
        Ok(Record {
            status,
            headers,
            body,
            body_omitted,
        })
    }
}

fn take<const N: usize>(rest: &mut &[u8], what: &'static str) -> Result<[u8; N], RecordError> {
    let slice = take_slice(rest, N, what)?;
    let mut array = [0u8; N];
    array.copy_from_slice(slice);
    Ok(array)
}

fn take_slice<'a>(
    rest: &mut &'a [u8],
    len: usize,
    what: &'static str,
) -> Result<&'a [u8], RecordError> {
    if rest.len() < len {
        return Err(RecordError::Malformed(what));
    }
    let (head, tail) = rest.split_at(len);
    *rest = tail;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            status: 201,
            headers: vec![
                (b"content-type".to_vec(), b"application/json".to_vec()),
                (b"location".to_vec(), b"/orders/7".to_vec()),
            ],
            body: b"{\"id\":7}\x00\xff".to_vec(),
            body_omitted: None,
        }
    }

    /// A record round-trips, body bytes and header order included, and
    /// its size is what `encoded_len` says; so does one without its body.
    #[test]
    fn records_round_trip() {
        for record in [
            sample(),
            sample().without_body(1 << 20),
            Record {
                headers: vec![],
                body: vec![],
                ..sample()
            },
        ] {
            let bytes = record.encode();
            assert_eq!(bytes.len(), record.encoded_len());
            assert_eq!(Record::decode(&bytes).unwrap(), record);
        }
    }

    /// Every prefix of a record with an omitted body, and every truncation
    /// inside the headers, is refused; so are foreign bytes — no panic on
    /// any input.
    #[test]
    fn malformed_records_are_refused() {
        let omitted = sample().without_body(5).encode();
        for cut in 0..omitted.len() {
            assert!(Record::decode(&omitted[..cut]).is_err(), "cut {cut}");
        }
        let full = sample().encode();
        let headers_end = full.len() - sample().body.len();
        for cut in 0..headers_end {
            assert!(Record::decode(&full[..cut]).is_err(), "cut {cut}");
        }
        assert_eq!(
            Record::decode(b"receipt r-7731"),
            Err(RecordError::NotARecord)
        );
        let mut bad_flags = full.clone();
        bad_flags[MAGIC.len()] = 0x80;
        assert!(Record::decode(&bad_flags).is_err());
        // A header count far beyond the bytes allocates nothing large.
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&[0, 0, 200, 0xff, 0xff]);
        assert!(Record::decode(&huge).is_err());
        // Pseudo-random bytes after the prefix: refused or decoded, never a panic.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..2_000 {
            let mut bytes = MAGIC.to_vec();
            for _ in 0..(state % 40) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bytes.push(state as u8);
            }
            let _ = Record::decode(&bytes);
        }
    }
}
