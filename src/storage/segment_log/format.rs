//! Byte layout of a segment file: a fixed header naming the segment, then
//! 8-byte aligned records, each framed as length + type + CRC32 of the
//! payload + CRC32 of the frame header. It only turns records into bytes and
//! back; it must not touch files or decide what a record means.
//!
//! ```text
//! segment header (24 bytes): magic (8) | sequence u64 LE | CRC32 of the 16 bytes before | 0 0 0 0
//! record: payload length u32 LE | type u8 | 0 0 0 | CRC32(payload) | CRC32(the 12 bytes before)
//!         | payload (format version byte + bincode) | zero padding to a multiple of 8
//! ```
//!
//! The header has its own checksum so that the search for valid records
//! after a damaged one (recovery's torn-tail test) can reject a candidate
//! offset from 16 bytes instead of checksumming whatever length garbage
//! claims, and can skip the payload of a damaged record whose header is
//! intact.

use serde::Serialize;

use oncekv_core::codec;

/// Identifies a segment file of this store, format version 1.
pub(super) const SEGMENT_MAGIC: [u8; 8] = *b"OKVSEG01";
pub(super) const SEGMENT_HEADER_BYTES: usize = 24;
pub(super) const FRAME_HEADER_BYTES: usize = 16;
/// Records start at multiples of this, which keeps the search for valid
/// records after a damaged one to one candidate per 8 bytes.
pub(super) const ALIGN_BYTES: usize = 8;
/// Version byte in front of every record payload.
pub(super) const FORMAT_VERSION: u8 = 1;

/// What a record holds. The numbers are on disk: never reuse one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RecordType {
    /// A batch of log entries (one `append` call), consecutive indexes.
    Entries = 1,
    /// Entries at and after this index are gone.
    Truncate = 2,
    /// Entries up to this log id are gone; it is the last purged log id.
    Purge = 3,
    /// The committed log id openraft saved last.
    Committed = 4,
    /// The vote.
    Vote = 5,
}

impl RecordType {
    pub(super) fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            1 => Self::Entries,
            2 => Self::Truncate,
            3 => Self::Purge,
            4 => Self::Committed,
            5 => Self::Vote,
            _ => return None,
        })
    }
}

/// The header of segment number `sequence`.
pub(super) fn segment_header(sequence: u64) -> [u8; SEGMENT_HEADER_BYTES] {
    let mut header = [0u8; SEGMENT_HEADER_BYTES];
    header[..8].copy_from_slice(&SEGMENT_MAGIC);
    header[8..16].copy_from_slice(&sequence.to_le_bytes());
    let crc = crc32fast::hash(&header[..16]);
    header[16..20].copy_from_slice(&crc.to_le_bytes());
    header
}

/// The sequence number in a valid segment header at the start of `bytes`.
pub(super) fn parse_segment_header(bytes: &[u8]) -> Option<u64> {
    let header = bytes.get(..SEGMENT_HEADER_BYTES)?;
    if header[..8] != SEGMENT_MAGIC
        || read_u32(header, 16)? != crc32fast::hash(&header[..16])
        || header[20..] != [0; 4]
    {
        return None;
    }
    Some(u64::from_le_bytes(header[8..16].try_into().ok()?))
}

/// A payload too large to frame: it could never be decoded again
/// (the codec refuses anything above its limit).
#[derive(Debug)]
pub(super) struct TooLarge {
    pub(super) payload_bytes: usize,
}

/// Appends one framed record holding `value` (behind the format version byte) to `out`,
/// encoding it straight into `out` so that entries are encoded exactly once.
pub(super) fn push_record<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    record_type: RecordType,
    value: &T,
) -> Result<(), TooLarge> {
    let start = out.len();
    out.resize(start + FRAME_HEADER_BYTES, 0);
    out.push(FORMAT_VERSION);
    codec::encode_into(value, out);
    let payload_start = start + FRAME_HEADER_BYTES;
    let payload_bytes = out.len() - payload_start;
    let length = match u32::try_from(payload_bytes) {
        Ok(length) if payload_bytes <= codec::DECODE_LIMIT_BYTES => length,
        _ => {
            out.truncate(start);
            return Err(TooLarge { payload_bytes });
        }
    };
    let payload_crc = crc32fast::hash(&out[payload_start..]);
    let header = &mut out[start..payload_start];
    header[..4].copy_from_slice(&length.to_le_bytes());
    header[4] = record_type as u8;
    header[8..12].copy_from_slice(&payload_crc.to_le_bytes());
    let header_crc = crc32fast::hash(&header[..12]);
    header[12..16].copy_from_slice(&header_crc.to_le_bytes());
    out.resize(start + padded(FRAME_HEADER_BYTES + payload_bytes), 0);
    Ok(())
}

/// `bytes` rounded up to the record alignment.
fn padded(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN_BYTES) * ALIGN_BYTES
}

/// One valid frame read back.
#[derive(Debug)]
pub(super) struct Frame<'a> {
    /// The type byte; unknown values are left to the caller to refuse.
    pub(super) type_byte: u8,
    /// Payload including the version byte.
    pub(super) payload: &'a [u8],
    /// Where the next record starts.
    pub(super) next_offset: usize,
}

/// The frame at `offset`, if one with both checksums intact is there.
/// Never panics, whatever `bytes` hold.
pub(super) fn read_frame(bytes: &[u8], offset: usize) -> Option<Frame<'_>> {
    let header = bytes.get(offset..offset.checked_add(FRAME_HEADER_BYTES)?)?;
    if read_u32(header, 12)? != crc32fast::hash(&header[..12]) || header[5..8] != [0; 3] {
        return None;
    }
    let length = usize::try_from(read_u32(header, 0)?).ok()?;
    let payload_start = offset + FRAME_HEADER_BYTES;
    let payload = bytes.get(payload_start..payload_start.checked_add(length)?)?;
    if read_u32(header, 8)? != crc32fast::hash(payload) {
        return None;
    }
    Some(Frame {
        type_byte: header[4],
        payload,
        // The padding of the last record may be cut off by the end of a
        // file that grew past its preallocation: the record is complete.
        next_offset: (offset + padded(FRAME_HEADER_BYTES + length)).min(bytes.len()),
    })
}

/// Where the search for valid records after a damaged one at `offset`
/// starts: past the damaged record when its frame header is intact (its
/// checksum vouches for the length, and the payload — user data — may hold
/// bytes that look like a frame), at the next aligned offset otherwise.
fn after_damaged_record(bytes: &[u8], offset: usize) -> usize {
    let intact_length = bytes
        .get(offset..offset.saturating_add(FRAME_HEADER_BYTES))
        .filter(|header| read_u32(header, 12) == Some(crc32fast::hash(&header[..12])))
        .and_then(|header| read_u32(header, 0))
        .and_then(|length| usize::try_from(length).ok());
    match intact_length {
        Some(length) => offset
            .saturating_add(padded(FRAME_HEADER_BYTES.saturating_add(length)))
            .max(offset + 1),
        None => offset + 1,
    }
}

/// The first offset after the damaged record at `offset` where a valid
/// frame starts: what tells a torn tail (nothing valid after it: the end of
/// a write a crash cut short) from damage in the middle of the log.
pub(super) fn valid_frame_after(bytes: &[u8], offset: usize) -> Option<usize> {
    let first = padded(after_damaged_record(bytes, offset));
    (first..bytes.len())
        .step_by(ALIGN_BYTES)
        .filter(|&candidate| {
            // Preallocated space is zeros: skip it without a checksum.
            bytes
                .get(candidate..candidate + FRAME_HEADER_BYTES)
                .is_some_and(|header| header.iter().any(|&byte| byte != 0))
        })
        .find(|&candidate| read_frame(bytes, candidate).is_some())
}

/// Whether every byte of `bytes` is zero. Compares 4 KiB blocks against
/// zeros (a `memcmp`) instead of byte by byte: recovery checks the whole
/// preallocated rest of every segment (64 MiB by default) on each start,
/// which byte by byte took seconds in a debug build on a loaded machine.
pub(super) fn all_zeros(bytes: &[u8]) -> bool {
    const ZEROS: [u8; 4096] = [0; 4096];
    bytes
        .chunks(ZEROS.len())
        .all(|block| block == &ZEROS[..block.len()])
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A single non-zero byte anywhere, in a whole block or the partial
    /// last one, is seen.
    #[test]
    fn all_zeros_sees_any_nonzero_byte() {
        assert!(all_zeros(&[]));
        for length in [1usize, 4095, 4096, 4097, 10_000] {
            let mut bytes = vec![0u8; length];
            assert!(all_zeros(&bytes), "{length}");
            for at in [0, length / 2, length - 1] {
                bytes[at] = 1;
                assert!(!all_zeros(&bytes), "{length} at {at}");
                bytes[at] = 0;
            }
        }
    }

    /// A record round-trips, every bit flip in its header or payload is
    /// caught by a checksum, and a cut-off record is never a frame.
    #[test]
    fn frames_round_trip_and_reject_damage() {
        let mut bytes = Vec::new();
        assert!(push_record(&mut bytes, RecordType::Truncate, &42u64).is_ok());
        assert_eq!(bytes.len() % ALIGN_BYTES, 0);
        let Some(frame) = read_frame(&bytes, 0) else {
            panic!("a fresh record does not read back");
        };
        assert_eq!(frame.type_byte, RecordType::Truncate as u8);
        assert_eq!(frame.next_offset, bytes.len());
        let value: Result<u64, _> = codec::decode_versioned(FORMAT_VERSION, frame.payload);
        assert_eq!(value.ok(), Some(42));
        let payload_end = FRAME_HEADER_BYTES + frame.payload.len();
        for at in 0..payload_end {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert!(read_frame(&damaged, 0).is_none(), "flip at {at} undetected");
        }
        for cut in 0..payload_end {
            assert!(read_frame(&bytes[..cut], 0).is_none());
        }
    }

    /// Segment headers carry their sequence and refuse damage.
    #[test]
    fn segment_headers() {
        let header = segment_header(7);
        assert_eq!(parse_segment_header(&header), Some(7));
        for at in 0..SEGMENT_HEADER_BYTES {
            let mut damaged = header;
            damaged[at] ^= 1;
            assert_eq!(parse_segment_header(&damaged), None);
        }
        assert_eq!(parse_segment_header(&header[..10]), None);
    }
}
