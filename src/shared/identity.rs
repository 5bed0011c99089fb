//! The node's record of which cluster it belongs to (rule 16), kept in the
//! file `cluster_id` of its data directory. The initialising node creates
//! the id before Raft's first entry; every other node adopts the id of the
//! first peer message it receives and keeps it forever after. Peer messages
//! of another cluster — or without an id, once one is known — are refused,
//! so a node of a wiped and re-created cluster can never exchange log
//! entries with the new one.
//!
//! The peer service (network) checks it and the node (wiring) creates it;
//! neither owns it, and it must not depend on `network` or `storage`. It
//! also holds the one way the data directory's small records are written
//! ([`replace_file_durably`]: this file, and the node's `node_id` and
//! `format` files).

use oncekv_core::ClusterId;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const FILE_NAME: &str = "cluster_id";

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} does not hold a cluster id")]
    Corrupt(PathBuf),
    #[error("this node belongs to cluster {ours}, not {theirs}")]
    Mismatch { ours: ClusterId, theirs: ClusterId },
}

/// Shared handle on the node's cluster id.
#[derive(Clone, Debug)]
pub struct ClusterIdentity {
    path: PathBuf,
    id: Arc<Mutex<Option<ClusterId>>>,
}

impl ClusterIdentity {
    /// Loads the id recorded in `data_dir`, if any.
    pub fn open(data_dir: &Path) -> Result<ClusterIdentity, IdentityError> {
        let path = data_dir.join(FILE_NAME);
        let id = match fs::read_to_string(&path) {
            Ok(text) => Some(
                u128::from_str_radix(text.trim(), 16)
                    .map(ClusterId)
                    .map_err(|_| IdentityError::Corrupt(path.clone()))?,
            ),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(IdentityError::Io { path, source }),
        };
        Ok(ClusterIdentity {
            path,
            id: Arc::new(Mutex::new(id)),
        })
    }

    pub fn get(&self) -> Option<ClusterId> {
        *self.id.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `id` durably if no id is known yet; an equal id is accepted,
    /// another one refused.
    pub fn adopt(&self, id: ClusterId) -> Result<(), IdentityError> {
        let mut current = self.id.lock().unwrap_or_else(|p| p.into_inner());
        match *current {
            Some(ours) if ours == id => Ok(()),
            Some(ours) => Err(IdentityError::Mismatch { ours, theirs: id }),
            None => {
                self.persist(id)?;
                *current = Some(id);
                tracing::info!(cluster_id = %id, "joined cluster");
                Ok(())
            }
        }
    }

    fn persist(&self, id: ClusterId) -> Result<(), IdentityError> {
        let io = |source| IdentityError::Io {
            path: self.path.clone(),
            source,
        };
        replace_file_durably(&self.path, format!("{id}\n").as_bytes()).map_err(io)
    }
}

/// Replaces the small file at `path` with `bytes` durably: a temporary file
/// beside it, fsync, rename, directory fsync. A crash leaves the old
/// content or the new one, never a mix.
pub fn replace_file_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    fs::write(&temporary, bytes)?;
    fs::File::open(&temporary)?.sync_all()?;
    fs::rename(&temporary, path)?;
    if let Some(dir) = path.parent() {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An adopted id survives a reopen; another id is refused.
    #[test]
    fn adopt_once_then_refuse_others() {
        let dir = tempfile::tempdir().unwrap();
        let identity = ClusterIdentity::open(dir.path()).unwrap();
        assert_eq!(identity.get(), None);
        identity.adopt(ClusterId(7)).unwrap();
        identity.adopt(ClusterId(7)).unwrap();
        assert!(matches!(
            identity.adopt(ClusterId(8)),
            Err(IdentityError::Mismatch { .. })
        ));
        let reopened = ClusterIdentity::open(dir.path()).unwrap();
        assert_eq!(reopened.get(), Some(ClusterId(7)));
    }
}
