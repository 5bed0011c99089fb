//! Opening a segment log directory: finds the segments, replays their
//! records in order into the in-memory log, vote and committed id, cuts a
//! torn tail off the last segment and refuses anything else that is
//! damaged or missing. It runs once, before the writer thread exists, and
//! must never panic on what it reads.
//!
//! What it cuts and what it refuses:
//!
//! - **Torn tail** (cut): damage at the end of the last segment with no
//!   valid record after it — zeros or part of a record where the last
//!   write stopped. Only the last group written can be cut short (each is
//!   fdatasynced before the next is acknowledged, and a segment before the
//!   next one exists), so nothing in it was acknowledged.
//! - **Damage followed by a valid record** (refused, [`SegmentLogError::Corrupt`]):
//!   whatever the damage looks like (a zeroed sector too), a valid record
//!   after it may hold acknowledged entries, and cutting there would drop
//!   them — a replica that forgets entries it acknowledged breaks Raft. So
//!   is any damage in a segment that is not the last.
//! - **Missing segments** (refused, [`SegmentLogError::NoSegments`],
//!   [`SegmentLogError::MissingSegment`]): segments are deleted only oldest
//!   first, only once a durable purge covers every entry in them, and the
//!   active one never. So a directory that held a log (its `LOCK` file is
//!   there) with no segment left, or whose oldest segment starts past the
//!   purge point, lost segments that held entries and the vote: starting
//!   would reset the vote to term 0 and revert the log.

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
use super::writer::segment_file_name;
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

/// The segments of a directory, oldest first.
struct Listed {
    /// The segments to replay: the run after the last gap in the numbering.
    segments: Vec<(u64, PathBuf)>,
    /// Segments before a gap: segments are only ever deleted oldest first
    /// after a durable purge covering them, so a gap means a deletion
    /// reached the disk for a newer segment but not for these older ones,
    /// whose content is purged. They are removed once the replay has shown
    /// that the purge indeed covers what precedes the segments kept (a gap
    /// made by hand is refused, and they are left alone).
    leftovers: Vec<PathBuf>,
    /// The first segment's temporary file was left over: a crash while the
    /// log was being created.
    unfinished: bool,
}

/// Lists the segments. Leftover temporary files are removed.
fn list_segments(dir: &Path) -> Result<Listed, SegmentLogError> {
    let mut segments = Vec::new();
    let mut unfinished = false;
    for item in fs::read_dir(dir).map_err(io_error(dir))? {
        let item = item.map_err(io_error(dir))?;
        let path = item.path();
        let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
            continue;
        };
        if name.ends_with(".seg.tmp") {
            tracing::info!(path = %path.display(), "removing an unfinished segment");
            fs::remove_file(&path).map_err(io_error(&path))?;
            unfinished |= name.strip_suffix(".tmp") == Some(segment_file_name(1).as_str());
        } else if let Some(sequence) = parse_segment_name(name) {
            segments.push((sequence, path));
        }
    }
    segments.sort_unstable_by_key(|(sequence, _)| *sequence);
    let mut first_kept = segments.len().saturating_sub(1);
    while first_kept > 0 && segments[first_kept - 1].0 + 1 == segments[first_kept].0 {
        first_kept -= 1;
    }
    let leftovers = segments.drain(..first_kept).map(|(_, path)| path).collect();
    Ok(Listed {
        segments,
        leftovers,
        unfinished,
    })
}

/// Refuses a log whose segments are missing (see the module doc): none
/// left in a directory that held a log, or an oldest segment that is not
/// the first ever (`sequence` 1) while the purge point does not reach the
/// entries it starts with.
fn check_nothing_missing<C>(
    dir: &Path,
    listed: &Listed,
    replay: &Replay<C>,
    held_a_log: bool,
) -> Result<(), SegmentLogError>
where
    C: RaftTypeConfig,
    C::Entry: Clone,
{
    let Some((first_sequence, _)) = listed.segments.first() else {
        if held_a_log && !listed.unfinished {
            return Err(SegmentLogError::NoSegments {
                dir: dir.to_path_buf(),
            });
        }
        return Ok(());
    };
    let Some(before) = first_sequence.checked_sub(1).filter(|&before| before > 0) else {
        // Segment 1 is where every log starts: nothing can precede it.
        return Ok(());
    };
    let purged_index = replay.memory.last_purged().map(|purged| purged.index);
    // Every entry in a deleted segment is at or below the purge point, and
    // the oldest segment left continues the deleted ones' entries (or the
    // purge point itself, had the log been purged past its end).
    let covered = match (purged_index, replay.first_index) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(purged), Some(first)) => first <= purged.saturating_add(1),
    };
    if covered {
        return Ok(());
    }
    Err(SegmentLogError::MissingSegment {
        path: dir.join(segment_file_name(before)),
        first_index: replay.first_index,
        purged_index,
    })
}

/// Replays one record.
struct Replay<C: RaftTypeConfig> {
    memory: MemoryLog<C>,
    vote: Option<VoteOf<C>>,
    committed: Option<LogIdOf<C>>,
    /// Index of the first entry replayed (whether purged since or not).
    first_index: Option<u64>,
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
                if self.first_index.is_none() {
                    self.first_index = entries.first().map(|entry| entry.index());
                }
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
        // exists), and a crash cuts it at some point: what is after the
        // damage is zeros or more of the same cut-short write, never a
        // valid record. A valid record after the damage (after a zeroed
        // sector too: etcd's WAL would cut there) may have been
        // acknowledged: the damage is corruption, and it is refused.
        let valid_record_offset = format::valid_frame_after(&bytes, offset);
        if !is_last || valid_record_offset.is_some() {
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

/// Opens (creating it if needed) the segment log in `dir`. `held_a_log`:
/// a log was opened there before (its lock file was there), so it cannot
/// be without segments.
pub(super) fn recover<C>(
    dir: &Path,
    segment_bytes: u64,
    held_a_log: bool,
) -> Result<Recovered<C>, SegmentLogError>
where
    C: RaftTypeConfig,
    C::Entry: Clone + DeserializeOwned,
{
    let listed = list_segments(dir)?;
    let Replayed {
        replay,
        sealed,
        last,
    } = replay_segments::<C>(&listed.segments)?;
    check_nothing_missing(dir, &listed, &replay, held_a_log)?;
    for path in &listed.leftovers {
        tracing::warn!(path = %path.display(), "removing a segment left over from a purge");
        fs::remove_file(path).map_err(io_error(path))?;
    }
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
        first_index: None,
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
            "dropped the torn tail of the last segment: a write a crash cut short, never \
             acknowledged (nothing valid follows it)"
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
