//! The harness's certificates and tokens for a run against a TLS cluster
//! (`--tls`): a CA, a certificate per node (naming `node-<id>`, `127.0.0.1`
//! and `localhost`), a client identity and an admin identity, each with a
//! certificate and a token, and the nodes' token file — all made by the
//! server binary's own `oncekv certs` command in the run's temporary
//! directory, so the harness links no server code. It also says which
//! `oncekv node` flags turn TLS and authentication on, and which
//! credentials each of the harness's callers shows. It decides nothing
//! about faults or checks, and never changes the files once made.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use oncekv_client::credentials::{CredentialPaths, Credentials};

/// The principal of the workload clients (role `client`).
pub const CLIENT: &str = "jepsen";
/// The principal of the nemesis's and the final reads' Admin calls (role
/// `admin`).
pub const ADMIN: &str = "jepsen-admin";

/// A directory filled by `oncekv certs` for nodes 1..=3, [`CLIENT`] and
/// [`ADMIN`].
#[derive(Clone, Debug)]
pub struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// Runs `server_bin certs` into `dir` for `nodes`.
    pub fn make(server_bin: &Path, dir: &Path, nodes: &[u64]) -> anyhow::Result<Pki> {
        let mut command = Command::new(server_bin);
        command.arg("certs").arg("--dir").arg(dir);
        for node in nodes {
            command.args(["--node", &node.to_string()]);
        }
        command.args(["--client", CLIENT, "--admin", ADMIN]);
        let output = command
            .output()
            .with_context(|| format!("run {} certs", server_bin.display()))?;
        if !output.status.success() {
            bail!(
                "{} certs failed: {}",
                server_bin.display(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(Pki {
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The `oncekv node` flags of node `id`: its certificate and key, the
    /// cluster CA (TLS on the client and peer ports, mutual between peers)
    /// and the token file (authentication on the client port).
    pub fn node_args(&self, id: u64) -> Vec<String> {
        let path = |name: String| self.dir.join(name).to_string_lossy().into_owned();
        vec![
            "--tls-cert".into(),
            path(format!("node-{id}.pem")),
            "--tls-key".into(),
            path(format!("node-{id}-key.pem")),
            "--tls-ca".into(),
            path("ca.pem".into()),
            "--token-file".into(),
            path("tokens".into()),
        ]
    }

    /// The CA only: enough for `Status` (open to everyone).
    pub fn anonymous(&self) -> anyhow::Result<Credentials> {
        self.load(CredentialPaths {
            ca: Some(self.dir.join("ca.pem")),
            ..CredentialPaths::default()
        })
    }

    /// Identity `name` by its bearer token.
    pub fn by_token(&self, name: &str) -> anyhow::Result<Credentials> {
        let token_path = self.dir.join(format!("{name}.token"));
        let token = std::fs::read_to_string(&token_path)
            .with_context(|| format!("read {}", token_path.display()))?;
        self.load(CredentialPaths {
            ca: Some(self.dir.join("ca.pem")),
            token: Some(token.trim().to_string()),
            ..CredentialPaths::default()
        })
    }

    /// Identity `name` by its client certificate (mutual TLS).
    pub fn by_certificate(&self, name: &str) -> anyhow::Result<Credentials> {
        self.load(CredentialPaths {
            ca: Some(self.dir.join("ca.pem")),
            cert: Some(self.dir.join(format!("{name}.pem"))),
            key: Some(self.dir.join(format!("{name}-key.pem"))),
            token: None,
        })
    }

    fn load(&self, paths: CredentialPaths) -> anyhow::Result<Credentials> {
        Credentials::load(&paths)
            .with_context(|| format!("load credentials from {}", self.dir.display()))
    }
}

/// Who shows what to the cluster during a run.
#[derive(Clone, Debug)]
pub struct RunCredentials {
    /// `Status` calls (the monitor, waits, leader agreement).
    pub status: Credentials,
    /// The nemesis's and the final reads' Admin calls.
    pub admin: Credentials,
    /// The workload clients: client number `n` shows `clients[n % len]`
    /// (with TLS: the token, then the client certificate, of one principal,
    /// so both ways of authenticating carry load).
    pub clients: Vec<Credentials>,
}

impl RunCredentials {
    /// Plain connections, no credentials (a cluster without TLS).
    pub fn none() -> RunCredentials {
        RunCredentials {
            status: Credentials::none(),
            admin: Credentials::none(),
            clients: vec![Credentials::none()],
        }
    }

    /// The credentials of `pki`'s identities.
    pub fn of(pki: &Pki) -> anyhow::Result<RunCredentials> {
        Ok(RunCredentials {
            status: pki.anonymous()?,
            admin: pki.by_token(ADMIN)?,
            clients: vec![pki.by_token(CLIENT)?, pki.by_certificate(CLIENT)?],
        })
    }

    /// What client number `client` shows.
    pub fn client(&self, client: u64) -> Credentials {
        let index = (client % self.clients.len().max(1) as u64) as usize;
        self.clients.get(index).cloned().unwrap_or_default()
    }
}
