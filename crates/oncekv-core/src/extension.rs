//! A snapshot sent as an *extension* of what its receiver already holds
//! (docs/state-beyond-ram.md §4.9p): a follower that fell behind holds most
//! of its leader's records already, in the same creation-time groups, so
//! the leader sends only the records whose TTL base is at or after the
//! cluster time of the follower's durable state, and the follower adds
//! them to its store.
//!
//! This module owns the decision, on both sides, and nothing else (the
//! stream's bytes are [`crate::snapshot`]'s, reading and writing stores
//! the adapter's):
//! - a node describes its durable state's records as a [`RecordsBase`]:
//!   its cluster time and, per live group, the group's bounds and what its
//!   records add up to ([`GroupDigest`]);
//! - the sender plans from it ([`Extension::plan`]): no plan unless every
//!   group of the base either lies wholly before the base's cluster time
//!   and is unchanged, or straddles or follows it and only grew — whatever
//!   else the summaries show (a group that lost records or vanished before
//!   its expiry, another snapshot format) is sent whole;
//! - the receiver checks what arrived against both states' summaries
//!   ([`GroupTally::extends`](crate::grouped)): each group of the snapshot
//!   must add up exactly to the base's group plus the records received
//!   into it, and each group of the base the snapshot lacks must be
//!   expired by it. Whatever the sender chose, a receiver that accepts an
//!   extension holds the snapshot's records (up to a collision of the
//!   multiset hash, as the state hash itself) once it adds them to its
//!   base; anything else is refused, and the sender sends the snapshot
//!   whole.
//!
//! A record in the receiver's base may come again (its TTL base is the
//! base's very cluster time, and an entry after the base had that time
//! too): the receiver asks its own store whether it holds it byte for byte
//! and, if so, does not count it as new.

use crate::Registry;
use crate::grouped::{GroupStore, Grouped};
use crate::snapshot::RecordsHash;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One live group as a base describes it: its interval of TTL bases and
/// what its records add up to (count, bytes charged, multiset hash).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupDigest {
    pub start_ms: u64,
    pub end_ms: u64,
    pub records: u64,
    pub bytes: u64,
    pub hash: [u8; 32],
}

/// What a state holds of the records a snapshot streams, in summary: what
/// a receiver tells a sender so that it sends only what was added since.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordsBase {
    /// The snapshot format the state is written in: an extension is sent
    /// only between states of one format (one rules version).
    pub format: u32,
    /// The state's cluster time: every record added after it has a TTL
    /// base at or after it.
    pub cluster_time_ms: u64,
    /// The live key groups, oldest first, and where the oldest starts
    /// (records of groups before it are expired).
    pub keys: Vec<GroupDigest>,
    pub first_live_key_group_ms: u64,
    /// The live groups of finished claims (rules version 3 on; `None`
    /// before, where finished claims are in the snapshot's part).
    pub claims: Option<Vec<GroupDigest>>,
    pub first_live_claim_group_ms: u64,
}

impl Registry {
    /// This state's [`RecordsBase`].
    pub fn records_base(&self) -> RecordsBase {
        let claims_grouped = self.rules.finished_claims_grouped();
        RecordsBase {
            format: crate::snapshot::format_of(self),
            cluster_time_ms: self.cluster_time_ms,
            keys: self.keys.digests(),
            first_live_key_group_ms: self.keys.first_live_group_ms(),
            claims: claims_grouped.then(|| self.finished_claims.digests()),
            first_live_claim_group_ms: self.finished_claims.first_live_group_ms(),
        }
    }
}

impl<R: Grouped> GroupStore<R> {
    /// The live groups' digests, oldest first.
    pub(crate) fn digests(&self) -> Vec<GroupDigest> {
        self.groups()
            .map(|(&start_ms, group)| GroupDigest {
                start_ms,
                end_ms: group.end_ms,
                records: group.usage.records,
                bytes: group.usage.bytes,
                hash: group.usage.hash.to_bytes(),
            })
            .collect()
    }
}

/// Which records of a group a sender sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    /// None: the receiver's group is the same.
    Skip,
    /// Those whose TTL base is at or after the base's cluster time (the
    /// group straddles it).
    Since,
    /// All (the group starts at or after the base's cluster time).
    All,
}

/// A sender's plan for one snapshot over one receiver's base: which
/// records to stream (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extension {
    since_ms: u64,
    keys: BTreeMap<u64, Choice>,
    claims: BTreeMap<u64, Choice>,
    /// The bytes (as the groups charge them) the records to send add up
    /// to, at most.
    bytes: u64,
}

/// Plans one kind's groups; `None` where the snapshot's groups do not
/// extend the base's.
fn plan_kind(
    this: &[GroupDigest],
    this_first_live_ms: u64,
    base: &[GroupDigest],
    since_ms: u64,
) -> Option<(BTreeMap<u64, Choice>, u64)> {
    let base_by_start: BTreeMap<u64, &GroupDigest> =
        base.iter().map(|group| (group.start_ms, group)).collect();
    let this_starts: std::collections::BTreeSet<u64> =
        this.iter().map(|group| group.start_ms).collect();
    // A base group the snapshot no longer has must be expired by it.
    if base
        .iter()
        .any(|group| group.start_ms >= this_first_live_ms && !this_starts.contains(&group.start_ms))
    {
        return None;
    }
    let mut choices = BTreeMap::new();
    let mut bytes = 0u64;
    for group in this {
        let choice = match base_by_start.get(&group.start_ms) {
            Some(base) if *base == group => Choice::Skip,
            Some(base) => {
                // Grown, never shrunk, and only by records the base's time
                // cannot have seen: a group that ended before it is sent
                // whole.
                if base.end_ms != group.end_ms
                    || base.records > group.records
                    || base.bytes > group.bytes
                    || group.end_ms <= since_ms
                {
                    return None;
                }
                bytes = bytes.checked_add(group.bytes - base.bytes)?;
                Choice::Since
            }
            None => {
                if group.start_ms < since_ms {
                    // A group the base lacks opened only after it, by
                    // records of its time or later.
                    bytes = bytes.checked_add(group.bytes)?;
                    Choice::Since
                } else {
                    bytes = bytes.checked_add(group.bytes)?;
                    Choice::All
                }
            }
        };
        choices.insert(group.start_ms, choice);
    }
    Some((choices, bytes))
}

impl Extension {
    /// The plan for sending the state `this` describes to a node whose
    /// durable state `base` describes, `None` when it must be sent whole:
    /// another format, a base not behind this state, groups that do not
    /// merely grow, or more than `bytes_max` bytes of records to send.
    pub fn plan(this: &RecordsBase, base: &RecordsBase, bytes_max: u64) -> Option<Extension> {
        if this.format != base.format
            || base.cluster_time_ms > this.cluster_time_ms
            || this.claims.is_some() != base.claims.is_some()
            || base.first_live_key_group_ms > this.first_live_key_group_ms
            || base.first_live_claim_group_ms > this.first_live_claim_group_ms
        {
            return None;
        }
        let since_ms = base.cluster_time_ms;
        let (keys, key_bytes) = plan_kind(
            &this.keys,
            this.first_live_key_group_ms,
            &base.keys,
            since_ms,
        )?;
        let (claims, claim_bytes) = match (&this.claims, &base.claims) {
            (Some(this_claims), Some(base_claims)) => plan_kind(
                this_claims,
                this.first_live_claim_group_ms,
                base_claims,
                since_ms,
            )?,
            _ => (BTreeMap::new(), 0),
        };
        let bytes = key_bytes.checked_add(claim_bytes)?;
        (bytes <= bytes_max).then_some(Extension {
            since_ms,
            keys,
            claims,
            bytes,
        })
    }

    /// The bytes (as the groups charge them) of the records to send, at
    /// most.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether a key record of group `group_ms`, stored as `stored`
    /// ([`crate::stored::key_record_bytes`]), is sent. A record of a group
    /// the plan does not know is sent (the receiver refuses what does not
    /// add up). A stored form that does not decode is an error.
    pub fn sends_key(
        &self,
        group_ms: u64,
        stored: &[u8],
    ) -> Result<bool, crate::codec::CodecError> {
        self.sends(&self.keys, group_ms, || {
            crate::stored::key_record_from_bytes(stored).map(|record| record.base_ms())
        })
    }

    /// [`Extension::sends_key`] for a finished claim's record.
    pub fn sends_claim(
        &self,
        group_ms: u64,
        stored: &[u8],
    ) -> Result<bool, crate::codec::CodecError> {
        self.sends(&self.claims, group_ms, || {
            crate::stored::claim_record_from_bytes(stored).map(|record| record.base_ms())
        })
    }

    fn sends(
        &self,
        choices: &BTreeMap<u64, Choice>,
        group_ms: u64,
        base_ms: impl FnOnce() -> Result<u64, crate::codec::CodecError>,
    ) -> Result<bool, crate::codec::CodecError> {
        Ok(
            match choices.get(&group_ms).copied().unwrap_or(Choice::All) {
                Choice::Skip => false,
                Choice::All => true,
                Choice::Since => base_ms()? >= self.since_ms,
            },
        )
    }
}

/// A receiver's side: what the base holds, by kind and group start, for
/// the reader of an extension ([`crate::snapshot::read_part_extending`]).
pub(crate) struct BaseGroups {
    pub(crate) cluster_time_ms: u64,
    pub(crate) keys: BTreeMap<u64, GroupDigest>,
    pub(crate) claims: BTreeMap<u64, GroupDigest>,
}

impl BaseGroups {
    pub(crate) fn of(base: &RecordsBase) -> BaseGroups {
        let by_start = |groups: &[GroupDigest]| {
            groups
                .iter()
                .map(|group| (group.start_ms, *group))
                .collect::<BTreeMap<_, _>>()
        };
        BaseGroups {
            cluster_time_ms: base.cluster_time_ms,
            keys: by_start(&base.keys),
            claims: base.claims.as_deref().map(by_start).unwrap_or_default(),
        }
    }
}

/// A base group's multiset hash, to add a tally to.
pub(crate) fn digest_hash(group: &GroupDigest) -> RecordsHash {
    RecordsHash::from_bytes(&group.hash)
}
