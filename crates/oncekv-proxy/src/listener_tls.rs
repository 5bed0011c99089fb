//! HTTPS on the proxy's own listener (`--tls-cert`, `--tls-key`): the
//! certificate chain and key the proxy presents to its callers, read from
//! PEM files, and read again on request (SIGHUP) without dropping a
//! connection — a pair that does not load leaves the one in force. It owns
//! the server-side TLS configuration and nothing of a request (the
//! handshake itself runs in [`crate::server`]). HTTP/1.1 only, as the
//! plain listener; TLS 1.2 and 1.3 with rustls' safe defaults (ring).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{ServerConfig, crypto};

/// The listener's certificate files and the configuration they make.
pub struct ListenerTls {
    cert: PathBuf,
    key: PathBuf,
    config: RwLock<Arc<ServerConfig>>,
}

impl std::fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerTls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl ListenerTls {
    /// Reads the certificate chain (PEM, the proxy's certificate first)
    /// and its private key (PEM); why not, naming the file.
    pub fn load(cert: &Path, key: &Path) -> Result<ListenerTls, String> {
        let config = server_config(cert, key)?;
        Ok(ListenerTls {
            cert: cert.to_owned(),
            key: key.to_owned(),
            config: RwLock::new(Arc::new(config)),
        })
    }

    /// Reads the files again: the new pair is presented from the next
    /// handshake on, or — when it does not load — the old one stays and
    /// the error says why.
    pub fn reload(&self) -> Result<(), String> {
        let config = server_config(&self.cert, &self.key)?;
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        Ok(())
    }

    /// The configuration for the next handshake.
    pub fn config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.config.read().unwrap_or_else(|e| e.into_inner()))
    }
}

fn server_config(cert: &Path, key: &Path) -> Result<ServerConfig, String> {
    let read = |flag: &str, path: &Path| {
        std::fs::read(path).map_err(|error| format!("{flag} {}: {error}", path.display()))
    };
    let chain_pem = read("--tls-cert", cert)?;
    let chain = CertificateDer::pem_slice_iter(&chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("--tls-cert {}: {error}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "--tls-cert {}: no PEM certificate in it",
            cert.display()
        ));
    }
    let key_pem = read("--tls-key", key)?;
    let private_key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|error| format!("--tls-key {}: {error}", key.display()))?;
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|error| format!("TLS: {error}"))?
            .with_no_client_auth()
            .with_single_cert(chain, private_key)
            .map_err(|error| {
                format!(
                    "--tls-cert {} and --tls-key {}: {error}",
                    cert.display(),
                    key.display()
                )
            })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_are_not_a_certificate_and_key_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        let missing = ListenerTls::load(&cert, &key).unwrap_err();
        assert!(
            missing.contains("--tls-cert") && missing.contains("cert.pem"),
            "{missing}"
        );
        std::fs::write(&cert, "not pem").unwrap();
        std::fs::write(&key, "not pem").unwrap();
        let empty = ListenerTls::load(&cert, &key).unwrap_err();
        assert!(empty.contains("no PEM certificate"), "{empty}");
    }
}
