//! The result `oncekv once` records for a command, in one place: its exit
//! code and its stdout (the first [`STDOUT_MAX_BYTES`] of it), as the
//! bytes a claim's completion stores and every later claim replays. It
//! owns the encoding and its decoding (a record from another writer, or a
//! newer format, is refused, never guessed at); it must not talk to the
//! cluster or run anything.
//!
//! # Encoding (format 1)
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..5 | `once1`: the format's name and version, ASCII |
//! | 5 | flags: bit 0 set when stdout was longer than was recorded; the other bits are 0 |
//! | 6..10 | the exit code, a signed 32-bit big-endian integer (0–255 from a process that exited, 128 + N for one killed by signal N, as shells report it) |
//! | 10.. | stdout, byte for byte, at most [`STDOUT_MAX_BYTES`] |
//!
//! The whole record is at most 64 KiB, the cluster's default
//! `claim_result_bytes_max`.

/// The format's name and version, the record's first bytes.
pub const MAGIC: &[u8; 5] = b"once1";

/// Bytes before stdout: the magic, the flags, the exit code.
pub const HEADER_BYTES: usize = MAGIC.len() + 1 + 4;

/// The cluster's default `claim_result_bytes_max`: a record never exceeds it.
pub const RECORD_BYTES_MAX: usize = 64 << 10;

/// The most stdout a record keeps (64 KiB less the header); a longer
/// stdout is recorded cut to this many bytes, with the truncated flag.
pub const STDOUT_MAX_BYTES: usize = RECORD_BYTES_MAX - HEADER_BYTES;

const FLAG_TRUNCATED: u8 = 1;

/// A command's recorded result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub exit_code: i32,
    /// The first [`STDOUT_MAX_BYTES`] (at most) of its stdout.
    pub stdout: Vec<u8>,
    /// Stdout was longer than `stdout`.
    pub truncated: bool,
}

/// Why recorded bytes are not a record of `oncekv once`.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("the recorded result ({0} bytes) was not written by `oncekv once` (no `once1` header)")]
    Foreign(usize),
    #[error("the recorded result has flags {0:#04x} this version does not know (a newer oncekv?)")]
    UnknownFlags(u8),
}

impl Record {
    /// The record's bytes (stdout beyond [`STDOUT_MAX_BYTES`] is cut and
    /// flagged).
    pub fn encode(&self) -> Vec<u8> {
        let kept = self.stdout.len().min(STDOUT_MAX_BYTES);
        let truncated = self.truncated || kept < self.stdout.len();
        let mut bytes = Vec::with_capacity(HEADER_BYTES + kept);
        bytes.extend_from_slice(MAGIC);
        bytes.push(if truncated { FLAG_TRUNCATED } else { 0 });
        bytes.extend_from_slice(&self.exit_code.to_be_bytes());
        bytes.extend_from_slice(&self.stdout[..kept]);
        bytes
    }

    /// The record in `bytes`, or why they are not one.
    pub fn decode(bytes: &[u8]) -> Result<Record, RecordError> {
        let foreign = || RecordError::Foreign(bytes.len());
        let rest = bytes.strip_prefix(MAGIC.as_slice()).ok_or_else(foreign)?;
        let (&flags, rest) = rest.split_first().ok_or_else(foreign)?;
        if flags & !FLAG_TRUNCATED != 0 {
            return Err(RecordError::UnknownFlags(flags));
        }
        let (code, stdout) = rest.split_first_chunk::<4>().ok_or_else(foreign)?;
        Ok(Record {
            exit_code: i32::from_be_bytes(*code),
            stdout: stdout.to_vec(),
            truncated: flags & FLAG_TRUNCATED != 0,
        })
    }

    /// This record without its stdout (flagged truncated): what is
    /// recorded when the cluster's `claim_result_bytes_max` is below the
    /// whole record.
    pub fn without_stdout(&self) -> Record {
        Record {
            exit_code: self.exit_code,
            stdout: Vec::new(),
            truncated: self.truncated || !self.stdout.is_empty(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record round-trips; its bytes are the documented layout.
    #[test]
    fn records_round_trip_in_the_documented_layout() {
        let record = Record {
            exit_code: -2,
            stdout: b"ran\n".to_vec(),
            truncated: false,
        };
        let bytes = record.encode();
        assert_eq!(bytes, b"once1\x00\xff\xff\xff\xferan\n");
        assert_eq!(Record::decode(&bytes), Ok(record));
        let killed = Record {
            exit_code: 137,
            stdout: Vec::new(),
            truncated: true,
        };
        assert_eq!(killed.encode(), b"once1\x01\x00\x00\x00\x89");
        assert_eq!(Record::decode(&killed.encode()), Ok(killed));
    }

    /// Stdout beyond the bound is cut and flagged, so a record never
    /// exceeds the cluster's default result limit.
    #[test]
    fn long_stdout_is_cut_and_flagged() {
        let record = Record {
            exit_code: 0,
            stdout: vec![b'x'; STDOUT_MAX_BYTES + 1],
            truncated: false,
        };
        let bytes = record.encode();
        assert_eq!(bytes.len(), RECORD_BYTES_MAX);
        let decoded = Record::decode(&bytes).unwrap();
        assert!(decoded.truncated);
        assert_eq!(decoded.stdout.len(), STDOUT_MAX_BYTES);
        let bare = record.without_stdout();
        assert_eq!(bare.encode().len(), HEADER_BYTES);
        assert!(Record::decode(&bare.encode()).unwrap().truncated);
    }

    /// Bytes another writer recorded, or a newer format's flags, are
    /// refused rather than misread.
    #[test]
    fn foreign_bytes_are_refused() {
        assert_eq!(
            Record::decode(b"charged 10 EUR"),
            Err(RecordError::Foreign(14))
        );
        assert_eq!(
            Record::decode(b"once1\x00\x00"),
            Err(RecordError::Foreign(7))
        );
        assert_eq!(Record::decode(b""), Err(RecordError::Foreign(0)));
        assert_eq!(
            Record::decode(b"once1\x02\x00\x00\x00\x00"),
            Err(RecordError::UnknownFlags(2))
        );
    }
}
