//! Opening a segment log directory: finds the segments, replays their
//! records in order into the in-memory log, vote and committed id, cuts a
//! torn tail off the last segment and refuses anything else that is
//! damaged. It runs once, before the writer thread exists, and must never
//! panic on what it reads.

use std::collections::VecDeque;
use std::fs;
use std::fs::OpenOptions;
use std::io;
use std::path::Path;
use std::path::PathBuf;

use openraft::RaftTypeConfig;
use openraft::entry::RaftEntry;
use openraft::type_config::alias::LogIdOf;
use openraft::type_config::alias::VoteOf;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::SegmentLogError;
use super::format;
use super::format::FORMAT_VERSION;
use super::format::RecordType;
use super::memory::MemoryLog;
use super::writer::ActiveSegment;
use super::writer::MetaKind;
use super::writer::SealedSegment;
use super::writer::WriterState;
use super::writer::create_segment;
use super::writer::sync_dir;
use oncekv_core::codec;

/// What the directory held.
pub(super) struct Recovered<C: RaftTypeConfig> {
    pub(super) memory: MemoryLog<C>,
    pub(super) vote: Option<VoteOf<C>>,
    pub(super) committed: Option<LogIdOf<C>>,
    pub(super) writer: WriterState,
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> SegmentLogError + '_ {
    move |source| SegmentLogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The sequence number in a segment file name.
fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 20 || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The segments to replay, oldest first. Leftover temporary files are
/// removed; so are segments before a gap in the numbering: segments are
/// only ever deleted oldest first after a durable purge covering them, so a
/// gap means a deletion reached the disk for a newer segment but not for
/// these older ones, whose content is purged.
fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>, SegmentLogError> {
    let mut segments = Vec::new();
    for item in fs::read_dir(dir).map_err(io_error(dir))? {
        let item = item.map_err(io_error(dir))?;
        let path = item.path();
        let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
            continue;
        };
        if name.ends_with(".seg.tmp") {
            tracing::info!(path = %path.display(), "removing an unfinished segment");
            fs::remove_file(&path).map_err(io_error(&path))?;
        } else if let Some(sequence) = parse_segment_name(name) {
            segments.push((sequence, path));
        }
    }
    segments.sort_unstable_by_key(|(sequence, _)| *sequence);
    let mut first_kept = segments.len().saturating_sub(1);
    while first_kept > 0 && segments[first_kept - 1].0 + 1 == segments[first_kept].0 {
        first_kept -= 1;
    }
    for (_, path) in segments.drain(..first_kept) {
        tracing::warn!(path = %path.display(), "removing a segment left over from a purge");
        fs::remove_file(&path).map_err(io_error(&path))?;
    }
    Ok(segments)
}

/// Replays one record.
struct Replay<C: RaftTypeConfig> {
    memory: MemoryLog<C>,
    vote: Option<VoteOf<C>>,
    committed: Option<LogIdOf<C>>,
}

impl<C> Replay<C>
where
    C: RaftTypeConfig,
    C::Entry: Clone + DeserializeOwned,
{
    /// Applies the record at `offset` of `path`; returns the highest entry
    /// index it holds.
    fn apply(
        &mut self,
        path: &Path,
        offset: usize,
        frame: &format::Frame<'_>,
    ) -> Result<Option<u64>, SegmentLogError> {
        let offset = offset as u64;
        let decode_error = |source| SegmentLogError::Decode {
            path: path.to_path_buf(),
            offset,
            source,
        };
        let Some(record_type) = RecordType::from_byte(frame.type_byte) else {
            return Err(SegmentLogError::UnknownRecord {
                path: path.to_path_buf(),
                offset,
                type_byte: frame.type_byte,
            });
        };
        match record_type {
            RecordType::Entries => {
                let mut entries: Vec<C::Entry> =
                    codec::decode_versioned(FORMAT_VERSION, frame.payload).map_err(decode_error)?;
                let skip = self.memory.accept(&entries).map_err(|gap| {
                    SegmentLogError::ReplayOutOfOrder {
                        path: path.to_path_buf(),
                        offset,
                        expected_index: gap.expected_index,
                        found_index: gap.found_index,
                    }
                })?;
                let last_index = entries.last().map(|entry| entry.index());
                entries.drain(..skip);
                self.memory.append(entries);
                return Ok(last_index);
            }
            RecordType::Truncate => {
                let index: u64 =
                    codec::decode_versioned(FORMAT_VERSION, frame.payload).map_err(decode_error)?;
                self.memory.truncate(index);
            }
            RecordType::Purge => {
                let log_id: LogIdOf<C> =
                    codec::decode_versioned(FORMAT_VERSION, frame.payload).map_err(decode_error)?;
                self.memory.purge(log_id);
            }
            RecordType::Committed => {
                self.committed =
                    codec::decode_versioned(FORMAT_VERSION, frame.payload).map_err(decode_error)?;
            }
            RecordType::Vote => {
                self.vote = Some(
                    codec::decode_versioned(FORMAT_VERSION, frame.payload).map_err(decode_error)?,
                );
            }
        }
        Ok(None)
    }
}

/// One replayed segment.
struct Scanned {
    last_index: Option<u64>,
    /// End of the last valid record.
    end_offset: usize,
    /// Bytes after `end_offset` that are neither zeros nor followed by a
    /// valid record: a write cut short by a crash.
    torn: bool,
}

fn replay_segment<C>(
    replay: &mut Replay<C>,
    sequence: u64,
    path: &Path,
    is_last: bool,
) -> Result<Scanned, SegmentLogError>
where
    C: RaftTypeConfig,
    C::Entry: Clone + DeserializeOwned,
{
    let bytes = fs::read(path).map_err(io_error(path))?;
    match format::parse_segment_header(&bytes) {
        Some(found) if found == sequence => {}
        found => {
            return Err(SegmentLogError::BadSegmentHeader {
                path: path.to_path_buf(),
                found_sequence: found,
            });
        }
    }
    let mut offset = format::SEGMENT_HEADER_BYTES;
    let mut last_index = None;
    while let Some(frame) = format::read_frame(&bytes, offset) {
        if let Some(index) = replay.apply(path, offset, &frame)? {
            last_index = Some(index);
        }
        offset = frame.next_offset;
    }
    let rest = bytes.get(offset..).unwrap_or_default();
    let torn = !format::all_zeros(rest);
    if torn {
        // Only the last group written can be cut short (each group is
        // fdatasynced before the next, and a segment before the next one
        // exists). Its pages may reach the disk in any order, though, so
        // valid records after the damage do not prove corruption: if the
        // damaged stretch holds a whole zeroed sector, that sector was never
        // written, no fdatasync covered it, and so none covered anything
        // after it either — an unacknowledged tail, dropped whole (etcd's
        // WAL reads a zeroed sector the same way). Damage without one is
        // corruption.
        let valid_record_offset = format::valid_frame_after(&bytes, offset);
        let torn_write =
            valid_record_offset.is_none_or(|next| format::has_zeroed_sector(&bytes, offset, next));
        if !is_last || !torn_write {
            return Err(SegmentLogError::Corrupt {
                path: path.to_path_buf(),
                offset: offset as u64,
                valid_record_offset: valid_record_offset.map(|at| at as u64),
            });
        }
    }
    Ok(Scanned {
        last_index,
        end_offset: offset,
        torn,
    })
}

/// Encodes the newest vote, committed id and purge for the writer to copy
/// into the head of new segments.
fn meta_frames<C>(replay: &Replay<C>) -> Result<[Option<Vec<u8>>; 3], SegmentLogError>
where
    C: RaftTypeConfig,
    C::Entry: Clone,
{
    fn frame<T: Serialize>(record_type: RecordType, value: &T) -> Result<Vec<u8>, SegmentLogError> {
        let mut frames = Vec::new();
        format::push_record(&mut frames, record_type, value).map_err(|too_large| {
            SegmentLogError::TooLarge {
                payload_bytes: too_large.payload_bytes,
            }
        })?;
        Ok(frames)
    }
    let mut frames: [Option<Vec<u8>>; 3] = Default::default();
    if let Some(vote) = &replay.vote {
        frames[MetaKind::Vote as usize] = Some(frame(RecordType::Vote, vote)?);
    }
    if let Some(committed) = &replay.committed {
        frames[MetaKind::Committed as usize] =
            Some(frame(RecordType::Committed, &Some(committed))?);
    }
    if let Some(purged) = replay.memory.last_purged() {
        frames[MetaKind::Purge as usize] = Some(frame(RecordType::Purge, &purged)?);
    }
    Ok(frames)
}

/// Opens (creating it if needed) the segment log in `dir`.
pub(super) fn recover<C>(dir: &Path, segment_bytes: u64) -> Result<Recovered<C>, SegmentLogError>
where
    C: RaftTypeConfig,
    C::Entry: Clone + DeserializeOwned,
{
    let segments = list_segments(dir)?;
    let Replayed {
        replay,
        sealed,
        last,
    } = replay_segments::<C>(&segments)?;
    let meta_frames = meta_frames(&replay)?;
    let active = match last {
        None => {
            let head: Vec<u8> = meta_frames.iter().flatten().flatten().copied().collect();
            create_segment(dir, 1, segment_bytes, &head).map_err(io_error(dir))?
        }
        Some((sequence, path, scanned)) => {
            reopen_last_segment(sequence, path, &scanned, segment_bytes)?
        }
    };
    // The lock and every segment file are in place: make their names durable
    // before anything is acknowledged from them.
    sync_dir(dir).map_err(io_error(dir))?;
    tracing::info!(
        dir = %dir.display(),
        segments = sealed.len() + 1,
        last_log_index = replay.memory.last_log_id().map(|log_id| log_id.index),
        "segment log opened"
    );
    Ok(Recovered {
        memory: replay.memory,
        vote: replay.vote,
        committed: replay.committed,
        writer: WriterState {
            dir: dir.to_path_buf(),
            segment_bytes,
            sealed,
            active,
            meta_frames,
            dirty: false,
            #[cfg(test)]
            fail_syncs: Default::default(),
            #[cfg(test)]
            synced: Default::default(),
        },
    })
}

/// Every segment of the directory, replayed.
struct Replayed<C: RaftTypeConfig> {
    replay: Replay<C>,
    /// Every segment but the last.
    sealed: VecDeque<SealedSegment>,
    /// The last one, to write on: its sequence number, path and scan.
    last: Option<(u64, PathBuf, Scanned)>,
}

/// Replays `segments` in order: the log, vote and committed id they hold,
/// every segment but the last as sealed, and the last one to write on.
fn replay_segments<C>(segments: &[(u64, PathBuf)]) -> Result<Replayed<C>, SegmentLogError>
where
    C: RaftTypeConfig,
    C::Entry: Clone + DeserializeOwned,
{
    let mut replay = Replay::<C> {
        memory: MemoryLog::default(),
        vote: None,
        committed: None,
    };
    let mut sealed = VecDeque::new();
    let mut last = None;
    for (position, (sequence, path)) in segments.iter().enumerate() {
        let is_last = position + 1 == segments.len();
        let scanned = replay_segment(&mut replay, *sequence, path, is_last)?;
        if is_last {
            last = Some((*sequence, path.clone(), scanned));
        } else {
            sealed.push_back(SealedSegment {
                path: path.clone(),
                last_index: scanned.last_index,
            });
        }
    }
    Ok(Replayed {
        replay,
        sealed,
        last,
    })
}

/// Opens the last segment for writing after its last good record, first
/// cutting off a torn tail.
fn reopen_last_segment(
    sequence: u64,
    path: PathBuf,
    scanned: &Scanned,
    segment_bytes: u64,
) -> Result<ActiveSegment, SegmentLogError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io_error(&path))?;
    if scanned.torn {
        // Zero what follows the last good record (cut, then grow back: the
        // kernel supplies zeros), so that nothing of the torn write can ever
        // be read as a record after new ones are written over its start.
        let end = scanned.end_offset as u64;
        let dropped_bytes = file
            .metadata()
            .map_err(io_error(&path))?
            .len()
            .saturating_sub(end);
        file.set_len(end)
            .and_then(|()| file.set_len(segment_bytes.max(end)))
            .and_then(|()| file.sync_all())
            .map_err(io_error(&path))?;
        tracing::warn!(
            path = %path.display(),
            offset = end,
            dropped_bytes,
            "dropped the torn tail of the last segment (a write never acknowledged)"
        );
    }
    Ok(ActiveSegment {
        sequence,
        path,
        file,
        offset: scanned.end_offset as u64,
        head_end: format::SEGMENT_HEADER_BYTES as u64,
        last_index: scanned.last_index,
    })
}

#[cfg(test)]
mod tests {
    use super::super::writer::segment_file_name;
    use super::*;

    /// Only zero-padded 20-digit `.seg` names are segments.
    #[test]
    fn segment_names() {
        assert_eq!(parse_segment_name(&segment_file_name(42)), Some(42));
        assert_eq!(parse_segment_name("42.seg"), None);
        assert_eq!(parse_segment_name("0000000000000000004x.seg"), None);
        assert_eq!(
            parse_segment_name(&format!("{}.tmp", segment_file_name(1))),
            None
        );
    }
}
