//! HTTPS on the proxy's own listener (`--tls-cert`, `--tls-key`): the
//! certificate chain and key the proxy presents to its callers, read from
//! PEM files, and read again on request (SIGHUP) without dropping a
//! connection — a pair that does not load leaves the one in force. It owns
//! the server-side TLS configuration and the name a caller's certificate
//! gives, and nothing else of a request (the handshake itself runs in
//! [`crate::server`], the decision on the caller in [`crate::flow`]). HTTP/1.1 only, as the
//! plain listener; TLS 1.2 and 1.3 with rustls' safe defaults (ring).
//!
//! With `--callers-ca` it also asks callers for certificates: one that
//! chains to that CA (through any intermediate) names its caller
//! ([`certified_caller`]: the subject's first common name, else its first
//! DNS name — `oncekv_wire::certificate`, the rule the cluster's nodes use
//! for principals), as a `--callers-file` token does.
//! Without a callers file the certificate is required at the handshake;
//! with one it is optional there (a token may name the caller instead) and
//! the request is decided in [`crate::Proxy::handle`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{ServerConfig, crypto};

/// Most bytes in a caller's name taken from a certificate (the callers
/// file's limit).
const NAME_BYTES_MAX: usize = crate::callers::NAME_BYTES_MAX;

/// Who asks callers for certificates (`--callers-ca`), and whether one is
/// required at the handshake.
#[derive(Clone, Debug)]
pub struct CallersCa {
    /// The PEM file of the CA certificates a caller's chain must reach.
    pub path: PathBuf,
    /// Required at the handshake (no `--callers-file`), or optional there.
    pub required: bool,
}

/// The caller a connection's certificate names, set on each of its
/// requests by [`crate::server`]: `Ok(name)`, or why the certificate names
/// no caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertifiedCaller(pub Result<String, String>);

/// The caller a verified certificate (DER) names: the holder name of
/// `oncekv_wire::certificate` (its subject's first common name, else its
/// first DNS name), at most [`NAME_BYTES_MAX`] bytes — the rule the
/// cluster's nodes use for principals; or why none.
pub fn certified_caller(der: &[u8]) -> CertifiedCaller {
    CertifiedCaller(
        oncekv_wire::certificate::holder_name(der, NAME_BYTES_MAX).map_err(|why| why.to_string()),
    )
}

/// The listener's certificate files and the configuration they make.
pub struct ListenerTls {
    cert: PathBuf,
    key: PathBuf,
    callers_ca: Option<CallersCa>,
    config: RwLock<Arc<ServerConfig>>,
}

impl std::fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerTls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("callers_ca", &self.callers_ca)
            .finish_non_exhaustive()
    }
}

impl ListenerTls {
    /// Reads the certificate chain (PEM, the proxy's certificate first)
    /// and its private key (PEM), and the callers' CA if given; why not,
    /// naming the file.
    pub fn load(
        cert: &Path,
        key: &Path,
        callers_ca: Option<CallersCa>,
    ) -> Result<ListenerTls, String> {
        let config = server_config(cert, key, callers_ca.as_ref())?;
        Ok(ListenerTls {
            cert: cert.to_owned(),
            key: key.to_owned(),
            callers_ca,
            config: RwLock::new(Arc::new(config)),
        })
    }

    /// Whether callers are asked for certificates (`--callers-ca`).
    pub fn asks_for_certificates(&self) -> bool {
        self.callers_ca.is_some()
    }

    /// Reads the files again (the callers' CA too): the new ones are used
    /// from the next handshake on, or — when they do not load — the old
    /// ones stay and the error says why.
    pub fn reload(&self) -> Result<(), String> {
        let config = server_config(&self.cert, &self.key, self.callers_ca.as_ref())?;
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        Ok(())
    }

    /// The configuration for the next handshake.
    pub fn config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.config.read().unwrap_or_else(|e| e.into_inner()))
    }
}

fn server_config(
    cert: &Path,
    key: &Path,
    callers_ca: Option<&CallersCa>,
) -> Result<ServerConfig, String> {
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
    let provider = Arc::new(crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS: {error}"))?;
    let builder = match callers_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let flag = format!("--callers-ca {}", ca.path.display());
            let roots = crate::upstream::trusted_roots(&read("--callers-ca", &ca.path)?, &flag)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if ca.required {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            builder.with_client_cert_verifier(
                verifier
                    .build()
                    .map_err(|error| format!("{flag}: {error}"))?,
            )
        }
    };
    let mut config = builder
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
        let missing = ListenerTls::load(&cert, &key, None).unwrap_err();
        assert!(
            missing.contains("--tls-cert") && missing.contains("cert.pem"),
            "{missing}"
        );
        std::fs::write(&cert, "not pem").unwrap();
        std::fs::write(&key, "not pem").unwrap();
        let empty = ListenerTls::load(&cert, &key, None).unwrap_err();
        assert!(empty.contains("no PEM certificate"), "{empty}");
    }

    fn certificate(common_name: Option<&str>, dns_names: &[&str]) -> Vec<u8> {
        use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
        let names: Vec<String> = dns_names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name = DistinguishedName::new();
        if let Some(name) = common_name {
            params.distinguished_name.push(DnType::CommonName, name);
        }
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn a_certificate_names_its_caller_by_common_name_else_dns_name() {
        let named = |der: Vec<u8>| certified_caller(&der).0;
        assert_eq!(
            named(certificate(Some("billing"), &["svc.test"])),
            Ok("billing".to_owned())
        );
        assert_eq!(
            named(certificate(None, &["svc.test", "other.test"])),
            Ok("svc.test".to_owned())
        );
        let nameless = named(certificate(None, &[])).unwrap_err();
        assert!(nameless.contains("names no holder"), "{nameless}");
        for bad in ["two words", "escape\u{1b}[31m", ""] {
            let refused = named(certificate(Some(bad), &["svc.test"])).unwrap_err();
            assert!(
                refused.contains("not a holder's name"),
                "{bad:?}: {refused}"
            );
        }
        let garbage = certified_caller(b"not a certificate").0.unwrap_err();
        assert!(garbage.contains("does not parse"), "{garbage}");
    }
}
