//! `oncekv certs`: a small local certificate authority for a test or a
//! self-managed cluster — the CA, node certificates named as
//! `network::tls` expects (`node-<id>` plus the hosts given), client
//! identities, and a token file with a random token per identity. It only
//! writes files into the directory it is given; it talks to no cluster.
//!
//! Files: `ca.pem`, `ca-key.pem`, `node-<id>.pem` / `node-<id>-key.pem`,
//! `<name>.pem` / `<name>-key.pem` / `<name>.token`, and `tokens` (the
//! node's `--token-file`: a `TOKEN NAME ROLE` line per identity, and a
//! `- NAME admin` line per admin so its certificate has the role too).
//! Keys are written readable by the owner only. An existing CA in the
//! directory is reused, so more certificates can be issued later.

use anyhow::{Context, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct CertsArgs {
    /// Directory to write into (created if absent). A CA already there
    /// (ca.pem, ca-key.pem) signs the new certificates.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Issue a node certificate for this node id (repeatable).
    #[arg(long = "node", value_name = "ID")]
    pub nodes: Vec<u64>,
    /// A host name or IP address the node certificates name, besides
    /// node-<id> (repeatable) [default: 127.0.0.1 and localhost].
    #[arg(long = "host", value_name = "NAME")]
    pub hosts: Vec<String>,
    /// Issue a client identity with role client (repeatable).
    #[arg(long = "client", value_name = "NAME")]
    pub clients: Vec<String>,
    /// Issue a client identity with role admin (repeatable).
    #[arg(long = "admin", value_name = "NAME")]
    pub admins: Vec<String>,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
        && !name.starts_with("node-")
        && name != "ca"
        && name != "tokens"
}

fn write_file(path: &Path, contents: &str, secret: bool) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(contents.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// The CA of `dir`, made if absent.
fn certificate_authority(dir: &Path) -> anyhow::Result<Issuer<'static, KeyPair>> {
    let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
    if cert_path.exists() {
        let key = std::fs::read_to_string(&key_path)
            .with_context(|| format!("reading {}", key_path.display()))?;
        let cert = std::fs::read_to_string(&cert_path)
            .with_context(|| format!("reading {}", cert_path.display()))?;
        let key = KeyPair::from_pem(&key).context("the CA key")?;
        return Issuer::from_ca_cert_pem(&cert, key).context("the CA certificate");
    }
    let mut params = CertificateParams::new(Vec::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "oncekv cluster CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    write_file(&cert_path, &cert.pem(), false)?;
    write_file(&key_path, &key.serialize_pem(), true)?;
    Ok(Issuer::new(params, key))
}

/// Issues `<stem>.pem` and `<stem>-key.pem` for `common_name` with the
/// DNS names / IP addresses `alt_names`.
fn issue(
    dir: &Path,
    ca: &Issuer<'_, KeyPair>,
    stem: &str,
    common_name: &str,
    alt_names: Vec<String>,
    usages: Vec<ExtendedKeyUsagePurpose>,
) -> anyhow::Result<()> {
    let mut params = CertificateParams::new(alt_names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = usages;
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, ca)?;
    write_file(&dir.join(format!("{stem}.pem")), &cert.pem(), false)?;
    write_file(
        &dir.join(format!("{stem}-key.pem")),
        &key.serialize_pem(),
        true,
    )
}

fn random_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 24];
    #[allow(clippy::disallowed_methods)] // a secret is random by definition
    rand::thread_rng().fill_bytes(&mut bytes);
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

impl CertsArgs {
    pub fn run(&self) -> anyhow::Result<()> {
        for name in self.clients.iter().chain(&self.admins) {
            if !valid_name(name) {
                bail!(
                    "identity name {name:?}: use 1 to 64 letters, digits, '-' or '_', not \
                     starting with node- (reserved for nodes), and not ca or tokens"
                );
            }
        }
        if let Some(zero) = self.nodes.iter().find(|id| **id == 0) {
            bail!("node id {zero} is reserved");
        }
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let ca = certificate_authority(&self.dir)?;
        let hosts = if self.hosts.is_empty() {
            vec!["127.0.0.1".to_string(), "localhost".to_string()]
        } else {
            self.hosts.clone()
        };
        for &id in &self.nodes {
            let name = crate::network::tls::node_name(id);
            let mut alt_names = vec![name.clone()];
            alt_names.extend(hosts.iter().cloned());
            issue(
                &self.dir,
                &ca,
                &name,
                &name,
                alt_names,
                // A node is a server on both ports and a client of its peers.
                vec![
                    ExtendedKeyUsagePurpose::ServerAuth,
                    ExtendedKeyUsagePurpose::ClientAuth,
                ],
            )?;
        }
        let mut grants = String::new();
        let identities = self
            .clients
            .iter()
            .map(|name| (name, "client"))
            .chain(self.admins.iter().map(|name| (name, "admin")));
        for (name, role) in identities {
            issue(
                &self.dir,
                &ca,
                name,
                name,
                vec![name.clone()],
                vec![ExtendedKeyUsagePurpose::ClientAuth],
            )?;
            let token = random_token();
            write_file(&self.dir.join(format!("{name}.token")), &token, true)?;
            grants.push_str(&format!("{token} {name} {role}\n"));
            if role == "admin" {
                grants.push_str(&format!("- {name} admin\n"));
            }
        }
        if !grants.is_empty() {
            let path = self.dir.join("tokens");
            let mut existing = std::fs::read_to_string(&path).unwrap_or_default();
            existing.push_str(&grants);
            write_file(&path, &existing, true)?;
        }
        println!("{}", self.dir.display());
        Ok(())
    }
}
